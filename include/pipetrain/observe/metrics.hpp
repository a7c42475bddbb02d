// Per-step figures: what each rank measured, combined on rank 0 into one metrics.jsonl line and
// one progress line. Keys: docs/design.md, "metrics.jsonl".
#pragma once
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "pipetrain/compute/precision.hpp"
#include "pipetrain/compute/profile.hpp"
#include "pipetrain/observe/router_figures.hpp"
#include "pipetrain/observe/stragglers.hpp"

namespace pipetrain {

// What one rank contributes for one logged step (gathered to rank 0 as doubles: kRankScalars, then
// the kernel classes' seconds, the GEMM FLOPs and the straggler window's figures).
struct RankFigures {
  double stage = 0, dp_rank = 0;
  double compute_s = 0;       // forward/backward/recompute, optimizer, data: all local work
  double bubble_wait_s = 0;   // waiting for pipeline peers (p2p, tied sync, step-boundary sync)
  double comm_wait_s = 0;     // all waiting incl. the data-parallel all-reduce
  double dp_wait_s = 0;       // of it, waiting for the data-parallel exchanges (gradient sums, ZeRO's gathers)
  double dp_comm_s = 0;       // the seconds those exchanges kept the replicas' link busy (Trace::take_exchange_s)
  double reduced_bytes = 0;   // gradient bytes this rank summed over its replicas this step
  double gathered_bytes = 0;  // weight bytes ZeRO's all-gathers brought into its buffer this step
  double rank_step_s = 0;     // this rank's own step wall time (compute + waits + overheads)
  double act_peak_bytes = 0;  // stashed activations, peak during the step
  double mem_peak_bytes = 0;  // process peak RSS
  double p2p_bytes = 0;       // pipeline messages' payload sent to other ranks this step
  // Floats this rank keeps between steps: weights (all of the stage's, or under ZeRO-3 its slabs),
  // gradients (all, or under ZeRO-2 and 3 its summed slabs), each AdamW moment (all, or its slabs).
  double weight_floats = 0, grad_floats = 0, optim_floats = 0;
  double loss_sum = 0;                               // summed token loss (last stage only)
  double gpu_mem_bytes = 0, gpu_mem_peak_bytes = 0;  // device memory allocated now / at peak (GPU runs)
  double samples_digest = 0;   // of the windows it read since the last line (Dataset::take_digest; 0: none)
  KernelTotals kernels;        // this step's compute by kernel class (profile.hpp)
  WindowFigures window;        // the straggler window this logging step closed (steps 0: none)
  void to(double* out) const;  // kRankFigureFields doubles
  static RankFigures from(const double* in);
};
// The scalars of RankFigures in the order they travel: a new figure is a member and a row here.
inline constexpr double RankFigures::*kRankScalars[] = {&RankFigures::stage,
                                                        &RankFigures::dp_rank,
                                                        &RankFigures::compute_s,
                                                        &RankFigures::bubble_wait_s,
                                                        &RankFigures::comm_wait_s,
                                                        &RankFigures::rank_step_s,
                                                        &RankFigures::act_peak_bytes,
                                                        &RankFigures::mem_peak_bytes,
                                                        &RankFigures::p2p_bytes,
                                                        &RankFigures::weight_floats,
                                                        &RankFigures::grad_floats,
                                                        &RankFigures::optim_floats,
                                                        &RankFigures::loss_sum,
                                                        &RankFigures::dp_wait_s,
                                                        &RankFigures::dp_comm_s,
                                                        &RankFigures::reduced_bytes,
                                                        &RankFigures::gathered_bytes,
                                                        &RankFigures::gpu_mem_bytes,
                                                        &RankFigures::gpu_mem_peak_bytes,
                                                        &RankFigures::samples_digest};
inline constexpr size_t kRankFigureFields = std::size(kRankScalars) + kKernelClasses + 1 + WindowFigures::kFields;

// Where a launch's time went so far, by rank 0's clock, from its launch record on: its training
// steps, the stalls of checkpoint saves (the whole save, or an asynchronous one's snapshot and its
// waits) and evaluations. metrics.jsonl's "launch_totals" and the stop record's; the rest of the
// launch (logging, the trace) is what they leave (tools/goodput_ledger).
struct LaunchTotals {
  double steps_s = 0, checkpoint_s = 0, eval_s = 0;
  nlohmann::json to_json() const;
};

struct StepLine {
  int step = 0, steps = 0;
  double time = 0;                         // wall clock when logged (Unix seconds)
  int launch = 0, tp = 1, pp = 0, dp = 0;  // which launch of the run, on which layout
  Arch arch = Arch::gpt2;                  // the model family: names kernel_s's norm and activation
  Dtype dtype = Dtype::fp32;               // model.dtype: names the GEMM sgemm_share is of
  double loss = 0, lr = 0, grad_norm = 0, step_time_s = 0, tokens_per_s = 0, bubble_theory = 0;
  double gflops = 0, peak_gflops = 0, mfu = 0;  // achieved model FLOP rate of the job, the hardware's peak, ratio
  double sgemm_gflops = 0, sgemm_share = 0;     // the job's BLAS GEMM rate (measured), gflops / that
  double val_loss = -1;                         // validation loss after this step (< 0: not evaluated)
  std::vector<std::pair<std::string, double>> val_loss_by_source;  // a mixture's: each source's own (evaluated ones)
  uint64_t samples_digest = 0;  // the ranks' digests of the windows read since the last line, summed
  std::vector<std::pair<std::string, double>> tokens_by_source;  // a mixture's: training tokens drawn so far
  bool skipped = false;                                          // NaN/Inf loss or gradient: the update was not applied
  int bad_steps = 0;                                             // steps skipped so far in this launch
  // Per stage, each combined from its ranks' figures by one row of kStageKeys (metrics.cpp).
  std::vector<double> bubble_measured, act_peak_bytes, mem_peak_bytes, comm_wait_s, compute_s, rank_step_s, p2p_bytes;
  std::vector<double> param_bytes, grad_bytes, optim_bytes;
  std::vector<double> dp_wait_s, dp_comm_s, reduced_bytes, gathered_bytes;
  std::vector<double> gpu_mem_bytes, gpu_mem_peak_bytes;  // written only when some rank has a GPU
  std::vector<std::vector<double>> kernel_s;              // [kernel class][stage] seconds, averaged over dp
  std::vector<double> gemm_gflops;                        // per stage: rate of the dense products inside the step
  nlohmann::json straggler_window;                        // "window" and "stragglers", when a window closed (else null)
  LaunchTotals launch_totals;                             // rank 0's running totals since the launch record
  std::vector<RouterFigures> routers;  // a mixture of experts': each MoE block's routing (kernel_s then has routing)
};

// Combines all ranks' figures (world order) into per-stage arrays (kStageKeys: bubble and waits
// averaged over the dp replicas of a stage, memory as the maximum); loss = summed loss / tokens per step.
StepLine combine(const std::vector<RankFigures>& ranks, int pp, double tokens_per_step);

std::string to_json(const StepLine& line);
std::string progress_line(const StepLine& line);

// What a resume cut from metrics.jsonl: the last step the file held before (0 for none: how far
// the launches before got), its line, and the last line kept (null where there is none).
struct CutLog {
  int64_t last_step = 0;
  nlohmann::json last_line, kept_last_line;
};

// Rewrites a metrics.jsonl keeping only the lines of steps <= `step` (a resumed run recomputes
// the rest, so each step appears once). A missing file is fine.
CutLog truncate_metrics(const std::string& path, int64_t step);

// Peak resident set size of this process in bytes.
double peak_rss_bytes();

// Appends JSON lines to RUN_DIR/metrics.jsonl, flushed per line so a killed run keeps its log.
class MetricsWriter {
 public:
  explicit MetricsWriter(const std::string& path);  // path empty: writes nothing
  ~MetricsWriter();
  void write(const std::string& json_line);

 private:
  std::FILE* f_ = nullptr;
  bool warned_ = false;
};

}  // namespace pipetrain
