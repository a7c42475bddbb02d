// What `pipetrain report` says about a run directory, as data: read from its files alone
// (config.toml, metrics.jsonl, events.jsonl, checkpoints/, trace.json), with the medians of what
// was measured, the per-stage figures of the last logged layout next to plan's prediction where
// the spec's layout is that one, and what is missing. tools/report.cpp renders it as text and as
// JSON, the same facts in both.
#pragma once
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pipetrain/config/spec.hpp"
#include "pipetrain/tools/goodput_ledger.hpp"
#include "pipetrain/tools/run_story.hpp"
#include "pipetrain/tools/straggler_report.hpp"

namespace pipetrain {

// Medians over the logged steps of one stage (NaN where the log lacks the key).
struct StageFigures {
  double bubble = NAN, act_peak_bytes = NAN, rss_bytes = NAN, state_bytes = NAN;
  // The data-parallel exchanges per step (medians): seconds waited for them (exposed) and on the
  // link in all, bytes reduced and gathered.
  double dp_wait_s = NAN, dp_comm_s = NAN, reduced_bytes = NAN, gathered_bytes = NAN;
  double bubble_sim = NAN, act_plan_bytes = NAN;  // plan's prediction (NaN without one)
  // Where the stage's own step time went, summed over the steps: each kernel class, "waiting",
  // "other" (shares adding up to 1; empty for logs without kernel timers), and its GEMM rate.
  std::vector<std::pair<std::string, double>> step_shares;
  double gemm_gflops = NAN;
};

struct RunSummary {
  std::string run_dir;
  std::optional<RunSpec> spec;  // config.toml, where readable

  // metrics.jsonl: the first and last logged step, evaluations, medians of every logged step.
  size_t logged_steps = 0;
  int first_step = -1, last_step = -1;
  double first_loss = NAN, last_loss = NAN;
  struct Evaluation {
    int step;
    double loss;
    std::vector<std::pair<std::string, double>> by_source;  // a mixture's sources' own, where logged
  };
  std::optional<Evaluation> latest_val, best_val;
  double step_time_s = NAN, tokens_per_s = NAN, gflops = NAN, mfu = NAN, sgemm_share = NAN;
  // A mixture of experts' routing (metrics.jsonl's moe_ keys): per MoE block, its busiest expert
  // over the mean share at the last logged step and the median over the logged steps, the share
  // of choices dropped at the last; the load-balancing loss at the first and last logged step.
  struct Routing {
    std::vector<int> blocks;
    std::vector<double> load_last, load_median, dropped_last;
    double aux_first = NAN, aux_last = NAN;
  };
  std::optional<Routing> routing;

  // Per stage, of the last logged layout (pp `stages` x dp `logged_dp`; -1: not logged).
  size_t stages = 0;
  int logged_dp = -1;
  bool predicted = false;                     // the spec's layout is the logged one: plan's figures apply
  double bubble_theory = NAN;                 // the schedule's with even stages (predicted only)
  size_t earlier_layout_steps = 0;            // logged steps of another layout, left out per stage
  std::optional<LaunchStory> oversubscribed;  // the launch measured, where it ran more threads than cores
  std::vector<StageFigures> per_stage;

  StragglerReport stragglers;
  RunStory story;
  Ledger ledger;                         // where the wall-clock went, per launch
  std::vector<std::string> checkpoints;  // step_N folders, in order
  std::string latest_checkpoint;         // what checkpoints/latest names ("" when none)
  std::string latest_problem;            // "" when the latest is intact
  std::string trace;                     // relative to run_dir; "" when none
  std::vector<std::string> missing;      // what the run directory lacks, and what that means
};

// Throws SpecError when run_dir is no directory or holds neither config.toml nor metrics.jsonl.
RunSummary summarize_run(const std::string& run_dir);

}  // namespace pipetrain
