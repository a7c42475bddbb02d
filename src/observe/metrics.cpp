#include "pipetrain/observe/metrics.hpp"

#include "pipetrain/util/rng.hpp"

#include "pipetrain/util/files.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace pipetrain {

void RankFigures::to(double* out) const {
  for (double RankFigures::*field : kRankScalars) *out++ = this->*field;
  out = std::copy(kernels.seconds.begin(), kernels.seconds.end(), out);
  *out++ = kernels.gemm_flops;
  window.to(out);
}

RankFigures RankFigures::from(const double* in) {
  RankFigures r;
  for (double RankFigures::*field : kRankScalars) r.*field = *in++;
  std::copy(in, in + kKernelClasses, r.kernels.seconds.begin());
  in += kKernelClasses;
  r.kernels.gemm_flops = *in++;
  r.window = WindowFigures::from(in);
  return r;
}

namespace {

// How a figure is written: 6 or 10 significant digits (the log stays short), every digit (loss and
// gradient norm: resumed runs are compared with uninterrupted ones bit for bit), milliseconds (Unix
// time), or a whole number (bytes).
enum class Digits { six, ten, all, millis, whole };

nlohmann::ordered_json figure(double v, Digits digits) {
  if (!std::isfinite(v)) return nullptr;  // JSON has no NaN or Inf (a skipped step's loss)
  switch (digits) {
    case Digits::all:
      return v;
    case Digits::whole:
      return static_cast<int64_t>(std::llround(v));
    case Digits::millis:
      return std::round(v * 1e3) / 1e3;
    default: {
      char buf[32];
      std::snprintf(buf, sizeof buf, digits == Digits::six ? "%.6g" : "%.10g", v);
      return std::strtod(buf, nullptr);  // written as the shortest decimal that reads back the same
    }
  }
}

// One per-stage key of metrics.jsonl: what each rank gives, how a stage's replicas combine, how it
// is written. A new per-stage key is a StepLine member and a row here (and its rank figure in
// kRankScalars).
enum class OverReplicas { mean, max, sum };
struct StageKey {
  const char* key;
  std::vector<double> StepLine::*values;
  double (*of_rank)(const RankFigures&);
  OverReplicas combine;
  Digits digits;
  bool gpu_only;  // written only where some rank has a GPU
};
const StageKey kStageKeys[] = {
    // The share of the pipelined part of the step the rank spent waiting for peers.
    {"bubble_measured", &StepLine::bubble_measured,
     [](const RankFigures& r) {
       const double busy = r.compute_s + r.bubble_wait_s;
       return busy > 0 ? r.bubble_wait_s / busy : 0;
     },
     OverReplicas::mean, Digits::six, false},
    {"act_peak_bytes", &StepLine::act_peak_bytes, [](const RankFigures& r) { return r.act_peak_bytes; },
     OverReplicas::max, Digits::whole, false},
    {"mem_peak_bytes", &StepLine::mem_peak_bytes, [](const RankFigures& r) { return r.mem_peak_bytes; },
     OverReplicas::max, Digits::whole, false},
    {"comm_wait_s", &StepLine::comm_wait_s, [](const RankFigures& r) { return r.comm_wait_s; }, OverReplicas::mean,
     Digits::six, false},
    // The data-parallel exchanges: what of them the rank waited for (exposed), and their bytes.
    {"dp_wait_s", &StepLine::dp_wait_s, [](const RankFigures& r) { return r.dp_wait_s; }, OverReplicas::mean,
     Digits::six, false},
    {"dp_comm_s", &StepLine::dp_comm_s, [](const RankFigures& r) { return r.dp_comm_s; }, OverReplicas::mean,
     Digits::six, false},
    {"reduced_bytes", &StepLine::reduced_bytes, [](const RankFigures& r) { return r.reduced_bytes; }, OverReplicas::max,
     Digits::whole, false},
    {"gathered_bytes", &StepLine::gathered_bytes, [](const RankFigures& r) { return r.gathered_bytes; },
     OverReplicas::max, Digits::whole, false},
    {"compute_s", &StepLine::compute_s, [](const RankFigures& r) { return r.compute_s; }, OverReplicas::mean,
     Digits::six, false},
    {"rank_step_s", &StepLine::rank_step_s, [](const RankFigures& r) { return r.rank_step_s; }, OverReplicas::mean,
     Digits::six, false},
    // What the stage's fullest rank keeps between steps (sharded slabs differ by a row).
    {"param_bytes", &StepLine::param_bytes, [](const RankFigures& r) { return 4 * r.weight_floats; }, OverReplicas::max,
     Digits::whole, false},
    {"grad_bytes", &StepLine::grad_bytes, [](const RankFigures& r) { return 4 * r.grad_floats; }, OverReplicas::max,
     Digits::whole, false},
    {"optim_bytes", &StepLine::optim_bytes, [](const RankFigures& r) { return 8 * r.optim_floats; }, OverReplicas::max,
     Digits::whole, false},
    // What the stage's ranks (every replica and tensor rank) sent to other stages: plan's pipeline
    // bytes per step are the sum over stages.
    {"p2p_bytes", &StepLine::p2p_bytes, [](const RankFigures& r) { return r.p2p_bytes; }, OverReplicas::sum,
     Digits::whole, false},
    {"gpu_mem_bytes", &StepLine::gpu_mem_bytes, [](const RankFigures& r) { return r.gpu_mem_bytes; }, OverReplicas::max,
     Digits::whole, true},
    {"gpu_mem_peak_bytes", &StepLine::gpu_mem_peak_bytes, [](const RankFigures& r) { return r.gpu_mem_peak_bytes; },
     OverReplicas::max, Digits::whole, true},
};

// The step's scalar figures, in the order the line shows them.
struct ScalarKey {
  const char* key;
  double StepLine::*value;
  Digits digits;
};
const ScalarKey kScalarKeys[] = {
    {"loss", &StepLine::loss, Digits::all},
    {"lr", &StepLine::lr, Digits::ten},
    {"grad_norm", &StepLine::grad_norm, Digits::all},
    {"step_time_s", &StepLine::step_time_s, Digits::six},
    {"tokens_per_s", &StepLine::tokens_per_s, Digits::six},
    {"bubble_theory", &StepLine::bubble_theory, Digits::six},
    {"gflops", &StepLine::gflops, Digits::six},
    {"peak_gflops", &StepLine::peak_gflops, Digits::six},
    {"mfu", &StepLine::mfu, Digits::six},
    {"sgemm_gflops", &StepLine::sgemm_gflops, Digits::six},
    {"sgemm_share", &StepLine::sgemm_share, Digits::six},
};

// printf of one figure for the progress line; "null" where it is not finite.
std::string num(double v, const char* format) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

nlohmann::ordered_json figures(const std::vector<double>& values, Digits digits) {
  nlohmann::ordered_json a = nlohmann::ordered_json::array();
  for (double v : values) a.push_back(figure(v, digits));
  return a;
}

}  // namespace

StepLine combine(const std::vector<RankFigures>& ranks, int pp, double tokens_per_step) {
  StepLine line;
  for (const StageKey& k : kStageKeys) (line.*k.values).assign(pp, 0);
  line.kernel_s.assign(kKernelClasses, std::vector<double>(pp, 0));
  line.gemm_gflops.assign(pp, 0);
  std::vector<double> gemm_flops(pp, 0);
  std::vector<int> count(pp, 0);
  double loss_sum = 0;
  for (const RankFigures& r : ranks) {
    const int s = static_cast<int>(r.stage);
    for (const StageKey& k : kStageKeys) {
      double& v = (line.*k.values)[s];
      v = k.combine == OverReplicas::max ? std::max(v, k.of_rank(r)) : v + k.of_rank(r);
    }
    for (int k = 0; k < kKernelClasses; ++k) line.kernel_s[k][s] += r.kernels.seconds[k];
    gemm_flops[s] += r.kernels.gemm_flops;
    count[s] += 1;
    loss_sum += r.loss_sum;
    line.samples_digest = (line.samples_digest + static_cast<uint64_t>(r.samples_digest)) & kDigestMask;
  }
  for (int s = 0; s < pp; ++s) {
    for (const StageKey& k : kStageKeys)
      if (k.combine == OverReplicas::mean) (line.*k.values)[s] /= count[s];
    const double gemm_s = line.kernel_s[static_cast<int>(Kernel::gemm)][s];
    line.gemm_gflops[s] = gemm_s > 0 ? gemm_flops[s] / gemm_s / 1e9 : 0;  // summed over replicas, like the time
    for (int k = 0; k < kKernelClasses; ++k) line.kernel_s[k][s] /= count[s];
  }
  line.loss = loss_sum / tokens_per_step;
  return line;
}

std::string to_json(const StepLine& l) {
  nlohmann::ordered_json j = {{"step", l.step},       {"time", figure(l.time, Digits::millis)},
                              {"launch", l.launch},   {"tp", l.tp},
                              {"pp", l.pp},           {"dp", l.dp},
                              {"skipped", l.skipped}, {"bad_steps", l.bad_steps}};
  for (const ScalarKey& k : kScalarKeys) j[k.key] = figure(l.*k.value, k.digits);
  if (l.val_loss >= 0) j["val_loss"] = figure(l.val_loss, Digits::all);
  if (!l.val_loss_by_source.empty()) {
    nlohmann::ordered_json by_source = nlohmann::ordered_json::object();
    for (const auto& [name, loss] : l.val_loss_by_source) by_source[name] = figure(loss, Digits::all);
    j["val_loss_by_source"] = by_source;
  }
  j["samples_digest"] = l.samples_digest;
  if (!l.tokens_by_source.empty()) {
    nlohmann::ordered_json by_source = nlohmann::ordered_json::object();
    for (const auto& [name, tokens] : l.tokens_by_source) by_source[name] = tokens;
    j["tokens_by_source"] = by_source;
  }
  const bool gpu =
      std::any_of(l.gpu_mem_peak_bytes.begin(), l.gpu_mem_peak_bytes.end(), [](double b) { return b > 0; });
  for (const StageKey& k : kStageKeys)
    if (gpu || !k.gpu_only) j[k.key] = figures(l.*k.values, k.digits);
  nlohmann::ordered_json kernels = nlohmann::ordered_json::object();
  for (size_t k = 0; k < l.kernel_s.size(); ++k)
    if (kernel_in_family(static_cast<Kernel>(k), l.arch, !l.routers.empty()))
      kernels[kernel_name(static_cast<Kernel>(k), l.arch)] = figures(l.kernel_s[k], Digits::six);
  j["kernel_s"] = kernels;
  j["gemm_gflops"] = figures(l.gemm_gflops, Digits::six);
  add_router_keys(j, l.routers);
  if (l.straggler_window.is_object())
    for (const auto& [key, value] : l.straggler_window.items()) j[key] = value;
  j["launch_totals"] = l.launch_totals.to_json();
  return j.dump();
}

std::string progress_line(const StepLine& l) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "step %*d/%d | loss %.4f | lr %.2e | gnorm %.3f | %8.0f tok/s | %7.1f ms | %5.1f GFLOP/s MFU %4.1f%% "
                "(%3.0f%% of %s) | bubble",
                static_cast<int>(std::to_string(l.steps).size()), l.step, l.steps, l.loss, l.lr, l.grad_norm,
                l.tokens_per_s, 1e3 * l.step_time_s, l.gflops, 100 * l.mfu, 100 * l.sgemm_share, gemm_name(l.dtype));
  std::string s = buf;
  for (double b : l.bubble_measured) s += " " + num(b, "%.2f");
  s += " (theory " + num(l.bubble_theory, "%.2f") + ")";
  double load = 0;  // the busiest expert of any MoE block, over the mean
  for (const RouterFigures& f : l.routers) load = std::max(load, f.load_max);
  if (!l.routers.empty()) s += " | expert load " + num(load, "%.2f") + "x mean";
  return l.val_loss >= 0 ? s + " | val " + num(l.val_loss, "%.4f") : s;
}

nlohmann::json LaunchTotals::to_json() const {
  return {{"steps_s", steps_s}, {"checkpoint_s", checkpoint_s}, {"eval_s", eval_s}};
}

CutLog truncate_metrics(const std::string& path, int64_t step) {
  CutLog cut;
  std::ifstream in(path);
  if (!in) return cut;
  std::string kept, line;
  while (std::getline(in, line)) {
    // Only whole records: a line cut short by a kill mid-write is dropped.
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
    const int64_t at = j["step"].get<int64_t>();
    if (at <= step) {
      kept += line + "\n";
      cut.kept_last_line = j;
    }
    if (at >= cut.last_step) {
      cut.last_step = at;
      cut.last_line = std::move(j);
    }
  }
  in.close();
  write_file_atomically(path, kept);
  return cut;
}

double peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024.0;
}

MetricsWriter::MetricsWriter(const std::string& path) {
  if (path.empty()) return;
  f_ = std::fopen(path.c_str(), "a");
  if (!f_) throw std::runtime_error(path + ": cannot open for writing");
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::write(const std::string& json_line) {
  if (!f_) return;
  std::fputs(json_line.c_str(), f_);
  std::fputc('\n', f_);
  if (std::fflush(f_) != 0 && !warned_) {  // e.g. disk full: say so once, keep training
    std::fprintf(stderr, "pipetrain: warning: metrics.jsonl: cannot write (%s); the log has gaps from here\n",
                 std::strerror(errno));
    warned_ = true;
  }
  if (warned_) std::clearerr(f_);
}

}  // namespace pipetrain
