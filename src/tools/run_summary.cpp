#include "pipetrain/tools/run_summary.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "pipetrain/ckpt/manifest.hpp"
#include "pipetrain/compute/profile.hpp"
#include "pipetrain/planner/plan.hpp"
#include "pipetrain/util/stats.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace pipetrain {
namespace {

// Median over logged steps of entry s of an array-valued key.
double stage_median(const std::vector<json>& lines, const char* key, size_t s) {
  std::vector<double> v;
  for (const json& l : lines)
    if (l.contains(key) && l[key].is_array() && s < l[key].size() && l[key][s].is_number())
      v.push_back(l[key][s].get<double>());
  return median(v);
}

double scalar_median(const std::vector<json>& lines, const char* key) {
  std::vector<double> v;
  for (const json& l : lines)
    if (l.contains(key) && l[key].is_number()) v.push_back(l[key].get<double>());
  return median(v);
}

// The lines of metrics.jsonl that are steps. Each per-stage array holds one entry per stage of the
// line's own pp: a line that does not was damaged or written by something else, and would be taken
// for another layout's step.
std::vector<json> read_steps(const std::string& run_dir, std::vector<std::string>& missing) {
  std::vector<json> lines;
  size_t unreadable = 0, inconsistent = 0;
  std::ifstream in(run_dir + "/metrics.jsonl");
  if (!in) missing.push_back("metrics.jsonl: nothing was logged (the run died before its first step?)");
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) {
      if (!line.empty()) ++unreadable;
      continue;
    }
    const int pp = j.value("pp", -1);
    bool fits = pp >= 1;
    for (const char* key : {"bubble_measured", "act_peak_bytes", "mem_peak_bytes"})
      fits = fits && j.contains(key) && j[key].is_array() && j[key].size() == static_cast<size_t>(pp);
    if (fits || !j.contains("pp")) {  // lines of old runs carry no pp
      lines.push_back(std::move(j));
    } else {
      ++inconsistent;
    }
  }
  if (unreadable)
    missing.push_back(std::to_string(unreadable) + " unreadable line(s) in metrics.jsonl (cut short by a kill?)");
  if (inconsistent)
    missing.push_back(std::to_string(inconsistent) +
                      " line(s) of metrics.jsonl left out: their per-stage arrays do not "
                      "have one entry per stage of their own pp (damaged?)");
  return lines;
}

// The MoE blocks' routing, where the lines log it (the last line's blocks).
void summarize_routing(const std::vector<json>& lines, RunSummary& r) {
  std::vector<json> moe;
  for (const json& l : lines)
    if (l.contains("moe_blocks") && l["moe_blocks"].is_array() && l.contains("moe_load_max")) moe.push_back(l);
  if (moe.empty()) return;
  RunSummary::Routing routing;
  const json& last = moe.back();
  for (size_t b = 0; b < last["moe_blocks"].size(); ++b) {
    routing.blocks.push_back(last["moe_blocks"][b].get<int>());
    routing.load_last.push_back(last["moe_load_max"].at(b).get<double>());
    routing.load_median.push_back(stage_median(moe, "moe_load_max", b));
    routing.dropped_last.push_back(last.contains("moe_dropped") ? last["moe_dropped"].at(b).get<double>() : 0.0);
  }
  routing.aux_first = moe.front().value("moe_aux_loss", NAN);
  routing.aux_last = last.value("moe_aux_loss", NAN);
  r.routing = routing;
}

void summarize_steps(const std::vector<json>& lines, RunSummary& r) {
  r.logged_steps = lines.size();
  if (lines.empty()) return;
  r.first_step = lines.front()["step"].get<int>();
  r.last_step = lines.back()["step"].get<int>();
  r.first_loss = lines.front().value("loss", NAN);
  r.last_loss = lines.back().value("loss", NAN);
  for (const json& l : lines) {
    if (!l.contains("val_loss")) continue;
    RunSummary::Evaluation e{l["step"].get<int>(), l["val_loss"].get<double>(), {}};
    if (l.contains("val_loss_by_source"))
      for (const auto& [name, loss] : l["val_loss_by_source"].items())
        e.by_source.emplace_back(name, loss.get<double>());
    r.latest_val = e;
    if (!r.best_val || e.loss < r.best_val->loss) r.best_val = e;
  }
  summarize_routing(lines, r);
  r.step_time_s = scalar_median(lines, "step_time_s");
  r.tokens_per_s = scalar_median(lines, "tokens_per_s");
  r.gflops = scalar_median(lines, "gflops");
  r.mfu = scalar_median(lines, "mfu");
  r.sgemm_share = scalar_median(lines, "sgemm_share");
}

// Where stage s's own step time went over the logged steps (each part's seconds summed over the
// steps, over the steps' summed time, so the parts add up to 1): each kernel class, the waits for
// peers (p2p, collectives, a late replica), and what neither covers; empty for logs without kernel_s.
std::vector<std::pair<std::string, double>> step_shares(const std::vector<json>& lines, size_t s) {
  auto at_stage = [&](const json& l, const char* key, const char* sub = nullptr) {
    const json* v = l.contains(key) ? &l[key] : nullptr;
    if (v && sub) v = v->is_object() && v->contains(sub) ? &(*v)[sub] : nullptr;
    return v && v->is_array() && s < v->size() && (*v)[s].is_number() ? (*v)[s].get<double>() : 0.0;
  };
  double step = 0;
  bool timed = false;
  for (const json& l : lines) {
    step += at_stage(l, "rank_step_s");
    timed = timed || l.contains("kernel_s");
  }
  std::vector<std::pair<std::string, double>> shares;
  if (!timed || step <= 0) return shares;
  // The kernel classes the log names (the model family names the norm and activation), in the
  // classes' order, then the waits.
  std::vector<std::string> names;
  for (int k = 0; k < kKernelClasses; ++k)
    for (Arch arch : {Arch::gpt2, Arch::llama}) {
      const std::string name = kernel_name(static_cast<Kernel>(k), arch);
      const bool logged = std::any_of(lines.begin(), lines.end(), [&](const json& l) {
        return l.contains("kernel_s") && l["kernel_s"].is_object() && l["kernel_s"].contains(name);
      });
      if (logged && std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
  double covered = 0;
  for (const std::string& name : names) {
    double seconds = 0;
    for (const json& l : lines) seconds += at_stage(l, "kernel_s", name.c_str());
    shares.emplace_back(name, seconds / step);
    covered += seconds / step;
  }
  double waits = 0;
  for (const json& l : lines) waits += at_stage(l, "comm_wait_s");
  shares.emplace_back("waiting", waits / step);
  covered += waits / step;
  shares.emplace_back("other", 1 - covered);
  return shares;
}

// The per-stage figures come from the steps of the last logged layout (a run resumed on another
// layout logged its earlier steps with other stages and batch shapes); the prediction is for the
// spec's layout, used only when the two are the same (a last launch may have logged no step).
void summarize_stages(const std::vector<json>& lines, RunSummary& r) {
  auto stages_of = [](const json& l) { return l.value("bubble_measured", json::array()).size(); };
  r.stages = !lines.empty() ? stages_of(lines.back()) : r.spec ? r.spec->parallel.pp : 0;
  r.logged_dp = lines.empty() ? -1 : lines.back().value("dp", -1);
  std::vector<json> per_stage;
  for (const json& l : lines)
    if (l.contains("bubble_measured") && l["bubble_measured"].is_array() && stages_of(l) == r.stages &&
        l.value("dp", -1) == r.logged_dp)
      per_stage.push_back(l);
  r.earlier_layout_steps = lines.size() - per_stage.size();
  r.predicted = r.spec && static_cast<size_t>(r.spec->parallel.pp) == r.stages &&
                (r.logged_dp < 0 || r.spec->parallel.dp == r.logged_dp);
  Plan plan;
  if (r.predicted) {
    plan = make_plan(*r.spec);
    r.bubble_theory = plan.bubble_theory;
  }
  const int mode = r.spec ? static_cast<int>(r.spec->parallel.recompute) : 0;
  const int logged_launch = lines.empty() ? -1 : lines.back().value("launch", -1);
  for (const LaunchStory& l : r.story.launches)
    if (l.launch == logged_launch && l.oversubscribed()) r.oversubscribed = l;
  for (size_t s = 0; s < r.stages; ++s) {
    StageFigures f;
    f.bubble = stage_median(per_stage, "bubble_measured", s);
    f.act_peak_bytes = stage_median(per_stage, "act_peak_bytes", s);
    f.rss_bytes = stage_median(per_stage, "mem_peak_bytes", s);
    f.state_bytes = stage_median(per_stage, "param_bytes", s) + stage_median(per_stage, "grad_bytes", s) +
                    stage_median(per_stage, "optim_bytes", s);  // as kept between steps
    f.dp_wait_s = stage_median(per_stage, "dp_wait_s", s);
    f.dp_comm_s = stage_median(per_stage, "dp_comm_s", s);
    f.reduced_bytes = stage_median(per_stage, "reduced_bytes", s);
    f.gathered_bytes = stage_median(per_stage, "gathered_bytes", s);
    if (r.predicted) {
      f.bubble_sim = plan.stages[s].bubble;
      f.act_plan_bytes = static_cast<double>(plan.stages[s].act_peak_bytes[mode]);
    }
    f.step_shares = step_shares(per_stage, s);
    f.gemm_gflops = stage_median(per_stage, "gemm_gflops", s);
    r.per_stage.push_back(std::move(f));
  }
  r.stragglers = straggler_report(per_stage, r.spec ? r.spec->log.straggler_ratio : RunSpec{}.log.straggler_ratio);
}

void summarize_checkpoints(RunSummary& r) {
  const std::string ck = r.run_dir + "/checkpoints";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(ck, ec))
    if (e.path().filename().string().rfind("step_", 0) == 0) r.checkpoints.push_back(e.path().filename().string());
  std::sort(r.checkpoints.begin(), r.checkpoints.end());
  if (r.checkpoints.empty()) {
    r.missing.push_back("checkpoints: none saved; a restart begins at step 0");
    return;
  }
  std::ifstream(ck + "/latest") >> r.latest_checkpoint;
  r.latest_problem = r.latest_checkpoint.empty() ? "no latest file" : verify_checkpoint(ck + "/" + r.latest_checkpoint);
}

// trace.json, or when the last launch traced nothing, the newest earlier launch's traces/launch_K.json
// (relative to the run directory; "" when there is none).
std::string latest_trace(const std::string& run_dir) {
  std::error_code ec;
  if (fs::exists(run_dir + "/trace.json", ec)) return "trace.json";
  int newest = 0;
  for (const auto& e : fs::directory_iterator(run_dir + "/traces", ec)) {
    int k = 0;
    if (std::sscanf(e.path().filename().c_str(), "launch_%d.json", &k) == 1) newest = std::max(newest, k);
  }
  return newest ? "traces/launch_" + std::to_string(newest) + ".json" : "";
}

}  // namespace

RunSummary summarize_run(const std::string& run_dir) {
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) throw SpecError(run_dir + ": no such run directory");
  RunSummary r;
  r.run_dir = run_dir;
  try {
    r.spec = load_spec(run_dir + "/config.toml", {}, 0);
  } catch (const SpecError& e) {
    r.missing.push_back(std::string("config.toml (") + e.what() + "): no prediction to compare with");
  }
  const std::vector<json> lines = read_steps(run_dir, r.missing);
  if (!r.spec && lines.empty()) throw SpecError(run_dir + " holds neither config.toml nor metrics.jsonl");
  summarize_steps(lines, r);
  const EventLog events = read_events(run_dir);
  r.story = run_story(run_dir, events, lines);
  std::vector<std::string> job_ids;  // Slurm's times of the run's jobs, where its accounting answers
  for (const json& e : events.records)
    if (e.value("event", "") == "launch" && e.contains("job_id") && e["job_id"].is_string())
      job_ids.push_back(e["job_id"].get<std::string>());
  std::string slurm = "no Slurm job";
  const std::vector<SlurmAttempt> attempts =
      job_ids.empty() ? std::vector<SlurmAttempt>{} : job_attempts(job_ids, slurm);
  r.ledger = goodput_ledger(events.records, lines, r.spec ? r.spec->log.straggler_ratio : RunSpec{}.log.straggler_ratio,
                            attempts, slurm);
  if (r.story.unreadable)
    r.missing.push_back(std::to_string(r.story.unreadable) +
                        " unreadable line(s) in events.jsonl (cut short by a kill?)");
  summarize_stages(lines, r);
  summarize_checkpoints(r);
  r.trace = latest_trace(run_dir);
  if (r.trace.empty())
    r.missing.push_back("trace.json: not written (log.trace_steps = 0, or the run died before its traced steps ended)");
  return r;
}

}  // namespace pipetrain
