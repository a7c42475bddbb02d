#include "pipetrain/observe/metrics.hpp"

#include "pipetrain/util/files.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace pipetrain {

void RankFigures::to(double* out) const {
  const double v[13] = {stage,          dp_rank,        compute_s,   bubble_wait_s, comm_wait_s,   rank_step_s,
                        act_peak_bytes, mem_peak_bytes, param_count, loss_sum,      gpu_mem_bytes, gpu_mem_peak_bytes,
                        optim_floats};
  out = std::copy(v, v + 13, out);
  out = std::copy(kernels.seconds.begin(), kernels.seconds.end(), out);
  *out++ = kernels.gemm_flops;
  window.to(out);
}

RankFigures RankFigures::from(const double* in) {
  RankFigures r;
  r.stage = in[0], r.dp_rank = in[1], r.compute_s = in[2], r.bubble_wait_s = in[3], r.comm_wait_s = in[4];
  r.rank_step_s = in[5], r.act_peak_bytes = in[6], r.mem_peak_bytes = in[7], r.param_count = in[8], r.loss_sum = in[9];
  r.gpu_mem_bytes = in[10], r.gpu_mem_peak_bytes = in[11], r.optim_floats = in[12];
  std::copy(in + 13, in + 13 + kKernelClasses, r.kernels.seconds.begin());
  r.kernels.gemm_flops = in[13 + kKernelClasses];
  r.window = WindowFigures::from(in + 14 + kKernelClasses);
  return r;
}

StepLine combine(const std::vector<RankFigures>& ranks, int pp, double tokens_per_step) {
  StepLine line;
  line.bubble_measured.assign(pp, 0);
  line.act_peak_bytes.assign(pp, 0);
  line.mem_peak_bytes.assign(pp, 0);
  line.comm_wait_s.assign(pp, 0);
  line.compute_s.assign(pp, 0);
  line.rank_step_s.assign(pp, 0);
  line.param_bytes.assign(pp, 0);
  line.grad_bytes.assign(pp, 0);
  line.optim_bytes.assign(pp, 0);
  line.kernel_s.assign(kKernelClasses, std::vector<double>(pp, 0));
  line.gemm_gflops.assign(pp, 0);
  std::vector<double> gemm_flops(pp, 0);
  std::vector<int> count(pp, 0);
  double loss_sum = 0;
  for (auto& r : ranks) {
    const int s = static_cast<int>(r.stage);
    // bubble: share of the pipelined part of the step this rank spent waiting for peers
    const double busy = r.compute_s + r.bubble_wait_s;
    line.bubble_measured[s] += busy > 0 ? r.bubble_wait_s / busy : 0;
    line.comm_wait_s[s] += r.comm_wait_s;
    line.compute_s[s] += r.compute_s;
    line.rank_step_s[s] += r.rank_step_s;
    line.param_bytes[s] = line.grad_bytes[s] = 4 * r.param_count;
    line.optim_bytes[s] = std::max(line.optim_bytes[s], 8 * r.optim_floats);  // the stage's largest share
    line.act_peak_bytes[s] = std::max(line.act_peak_bytes[s], r.act_peak_bytes);
    line.mem_peak_bytes[s] = std::max(line.mem_peak_bytes[s], r.mem_peak_bytes);
    if (r.gpu_mem_peak_bytes > 0) {
      line.gpu_mem_bytes.resize(pp, 0), line.gpu_mem_peak_bytes.resize(pp, 0);
      line.gpu_mem_bytes[s] = std::max(line.gpu_mem_bytes[s], r.gpu_mem_bytes);
      line.gpu_mem_peak_bytes[s] = std::max(line.gpu_mem_peak_bytes[s], r.gpu_mem_peak_bytes);
    }
    for (int k = 0; k < kKernelClasses; ++k) line.kernel_s[k][s] += r.kernels.seconds[k];
    gemm_flops[s] += r.kernels.gemm_flops;
    count[s] += 1;
    loss_sum += r.loss_sum;
  }
  for (int s = 0; s < pp; ++s) {
    line.bubble_measured[s] /= count[s];
    line.comm_wait_s[s] /= count[s];
    line.compute_s[s] /= count[s];
    line.rank_step_s[s] /= count[s];
    const double gemm_s = line.kernel_s[static_cast<int>(Kernel::gemm)][s];
    line.gemm_gflops[s] = gemm_s > 0 ? gemm_flops[s] / gemm_s / 1e9 : 0;  // summed over replicas, like the time
    for (int k = 0; k < kKernelClasses; ++k) line.kernel_s[k][s] /= count[s];
  }
  line.loss = loss_sum / tokens_per_step;
  return line;
}

namespace {

std::string num(double v, const char* fmt = "%.10g") {
  if (!std::isfinite(v)) return "null";  // JSON has no NaN or Inf (a skipped step's loss)
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

std::string array(const std::vector<double>& v, const char* fmt = "%.6g") {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + num(v[i], fmt);
  return s + "]";
}

std::string kernel_object(const std::vector<std::vector<double>>& kernel_s) {
  std::string s = "{";
  for (size_t k = 0; k < kernel_s.size(); ++k)
    s += (k ? ", \"" : "\"") + std::string(kernel_name(static_cast<Kernel>(k))) + "\": " + array(kernel_s[k]);
  return s + "}";
}

}  // namespace

std::string to_json(const StepLine& l) {
  // loss and grad_norm with all 17 digits: resumed runs are compared with uninterrupted ones bit for bit
  return "{\"step\": " + std::to_string(l.step) + ", \"time\": " + num(l.time, "%.3f") + ", \"launch\": " +
         std::to_string(l.launch) + ", \"pp\": " + std::to_string(l.pp) + ", \"dp\": " + std::to_string(l.dp) +
         ", \"loss\": " + num(l.loss, "%.17g") + ", \"lr\": " + num(l.lr) +
         ", \"grad_norm\": " + num(l.grad_norm, "%.17g") + ", \"skipped\": " + (l.skipped ? "true" : "false") +
         ", \"bad_steps\": " + std::to_string(l.bad_steps) + ", \"step_time_s\": " + num(l.step_time_s, "%.6g") +
         ", \"tokens_per_s\": " + num(l.tokens_per_s, "%.6g") + ", \"bubble_theory\": " + num(l.bubble_theory, "%.6g") +
         ", \"bubble_measured\": " + array(l.bubble_measured) + ", \"act_peak_bytes\": " + array(l.act_peak_bytes, "%.0f") +
         ", \"mem_peak_bytes\": " + array(l.mem_peak_bytes, "%.0f") + ", \"comm_wait_s\": " + array(l.comm_wait_s) +
         ", \"compute_s\": " + array(l.compute_s) + ", \"rank_step_s\": " + array(l.rank_step_s) +
         ", \"param_bytes\": " + array(l.param_bytes, "%.0f") + ", \"grad_bytes\": " + array(l.grad_bytes, "%.0f") +
         ", \"optim_bytes\": " + array(l.optim_bytes, "%.0f") + ", \"gflops\": " + num(l.gflops, "%.6g") +
         ", \"peak_gflops\": " + num(l.peak_gflops, "%.6g") + ", \"mfu\": " + num(l.mfu, "%.6g") +
         ", \"sgemm_gflops\": " + num(l.sgemm_gflops, "%.6g") + ", \"sgemm_share\": " + num(l.sgemm_share, "%.6g") +
         ", \"kernel_s\": " + kernel_object(l.kernel_s) + ", \"gemm_gflops\": " + array(l.gemm_gflops) +
         (l.val_loss >= 0 ? ", \"val_loss\": " + num(l.val_loss, "%.17g") : "") +
         (l.gpu_mem_bytes.empty() ? ""
                                  : ", \"gpu_mem_bytes\": " + array(l.gpu_mem_bytes, "%.0f") +
                                        ", \"gpu_mem_peak_bytes\": " + array(l.gpu_mem_peak_bytes, "%.0f")) +
         (l.straggler_keys.empty() ? "" : ", " + l.straggler_keys) + "}";
}

std::string progress_line(const StepLine& l) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "step %*d/%d | loss %.4f | lr %.2e | gnorm %.3f | %8.0f tok/s | %7.1f ms | %5.1f GFLOP/s MFU %4.1f%% (%3.0f%% of sgemm) | bubble",
                static_cast<int>(std::to_string(l.steps).size()), l.step, l.steps, l.loss, l.lr, l.grad_norm,
                l.tokens_per_s, 1e3 * l.step_time_s, l.gflops, 100 * l.mfu, 100 * l.sgemm_share);
  std::string s = buf;
  for (double b : l.bubble_measured) s += " " + num(b, "%.2f");
  s += " (theory " + num(l.bubble_theory, "%.2f") + ")";
  return l.val_loss >= 0 ? s + " | val " + num(l.val_loss, "%.4f") : s;
}

int64_t truncate_metrics(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return 0;
  std::string kept, line;
  int64_t last = 0;
  while (std::getline(in, line)) {
    // Only whole records: a line cut short by a kill mid-write is dropped.
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
    last = std::max(last, j["step"].get<int64_t>());
    if (j["step"].get<int64_t>() <= step) kept += line + "\n";
  }
  in.close();
  write_file_atomically(path, kept);
  return last;
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
