// The metrics line (observe/metrics.hpp): per-rank figures combined per stage (means over a
// stage's replicas, peaks as maxima, bytes sent as sums, the loss over the global batch), and the JSON line.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "pipetrain/observe/metrics.hpp"

using namespace pipetrain;

namespace {

RankFigures rank(int stage, int dp, double compute, double bubble_wait, double act, double loss) {
  RankFigures r;
  r.stage = stage;
  r.dp_rank = dp;
  r.compute_s = compute;
  r.bubble_wait_s = bubble_wait;
  r.comm_wait_s = bubble_wait + 0.1;
  r.rank_step_s = compute + bubble_wait;
  r.act_peak_bytes = act;
  r.mem_peak_bytes = 1000 + act;
  r.p2p_bytes = 2 * act;
  r.weight_floats = 10 + stage;
  r.grad_floats = 5 + stage;  // a sharded gradient
  r.optim_floats = 10 + stage;
  r.loss_sum = loss;
  r.kernels.seconds[static_cast<int>(Kernel::gemm)] = compute / 2;
  r.kernels.gemm_flops = 1e9 * compute;
  return r;
}

}  // namespace

TEST_CASE("metrics: a 2x2 job's figures combine per stage", "[metrics]") {
  // stages 0 and 1, two replicas each; only the last stage has a loss
  const std::vector<RankFigures> ranks = {rank(0, 0, 1.0, 1.0, 100, 0), rank(1, 0, 2.0, 0.0, 50, 30),
                                          rank(0, 1, 3.0, 1.0, 300, 0), rank(1, 1, 2.0, 2.0, 70, 34)};
  const StepLine line = combine(ranks, 2, 64);
  CHECK(line.loss == Approx(64.0 / 64));                       // summed token loss over the global batch's tokens
  CHECK(line.bubble_measured[0] == Approx((0.5 + 0.25) / 2));  // wait / (compute + wait), mean over replicas
  CHECK(line.bubble_measured[1] == Approx((0.0 + 0.5) / 2));
  CHECK(line.compute_s[0] == Approx(2.0));
  CHECK(line.act_peak_bytes[0] == 300);  // the peak over replicas
  CHECK(line.mem_peak_bytes[1] == 1070);
  CHECK(line.p2p_bytes[0] == 2 * 100 + 2 * 300);  // what the stage's ranks sent: summed over replicas
  CHECK(line.param_bytes[1] == 4 * 11);
  CHECK(line.grad_bytes[1] == 4 * 6);
  CHECK(line.optim_bytes[1] == 8 * 11);
  CHECK(line.gemm_gflops[0] == Approx(4e9 / 2.0 / 1e9));  // flops over gemm seconds, both summed over replicas
  CHECK_FALSE(nlohmann::json::parse(to_json(line)).contains("gpu_mem_bytes"));  // CPU ranks: no GPU keys
}

TEST_CASE("metrics: a rank's figures travel as doubles and come back whole", "[metrics]") {
  RankFigures r = rank(1, 1, 2.5, 0.75, 123, 9);
  double v = 1;
  for (double RankFigures::*field : kRankScalars) r.*field = v++;  // a distinct value in every field
  for (double& s : r.kernels.seconds) s = v++;
  r.kernels.gemm_flops = v++;
  r.window.steps = v++;
  r.window.link_s[1] = v++;
  std::vector<double> packed(kRankFigureFields);
  r.to(packed.data());
  const RankFigures back = RankFigures::from(packed.data());
  for (double RankFigures::*field : kRankScalars) CHECK(back.*field == r.*field);
  CHECK(back.kernels.seconds == r.kernels.seconds);
  CHECK(back.kernels.gemm_flops == r.kernels.gemm_flops);
  CHECK(back.window.steps == r.window.steps);
  CHECK(back.window.link_s[1] == r.window.link_s[1]);
}

TEST_CASE("metrics: GPU memory is written where a rank has a GPU, figures keep 6 digits, bytes whole", "[metrics]") {
  std::vector<RankFigures> ranks = {rank(0, 0, 1.0, 0.5, 100, 0), rank(0, 1, 1.0, 0.5, 100, 0)};
  ranks[1].gpu_mem_bytes = 5e8;
  ranks[1].gpu_mem_peak_bytes = 7e8;
  ranks[0].compute_s = 1.0 / 3;
  const nlohmann::json j = nlohmann::json::parse(to_json(combine(ranks, 1, 32)));
  CHECK(j["gpu_mem_bytes"] == nlohmann::json({500000000}));
  CHECK(j["gpu_mem_peak_bytes"][0].is_number_integer());
  CHECK(j["compute_s"][0].get<double>() == 0.666667);  // (1/3 + 1) / 2 to 6 significant digits
  CHECK(j["act_peak_bytes"][0].is_number_integer());
}

TEST_CASE("metrics: the JSON line parses, carries every key, and writes a skipped step's NaN as null", "[metrics]") {
  const std::vector<RankFigures> ranks = {rank(0, 0, 1.0, 0.5, 100, 0), rank(1, 0, 1.0, 0.5, 100, 20)};
  StepLine line = combine(ranks, 2, 32);
  line.step = 7;
  line.steps = 10;
  line.lr = 1e-3;
  line.grad_norm = NAN;
  line.skipped = true;
  line.bad_steps = 1;
  line.step_time_s = 0.5;
  line.tokens_per_s = 64;
  line.bubble_theory = 0.2;
  line.gflops = 1;
  line.peak_gflops = 10;
  line.mfu = 0.1;
  nlohmann::json j = nlohmann::json::parse(to_json(line));
  for (const char* key : {"step",
                          "loss",
                          "lr",
                          "grad_norm",
                          "skipped",
                          "bad_steps",
                          "step_time_s",
                          "tokens_per_s",
                          "bubble_theory",
                          "bubble_measured",
                          "act_peak_bytes",
                          "mem_peak_bytes",
                          "comm_wait_s",
                          "compute_s",
                          "rank_step_s",
                          "p2p_bytes",
                          "param_bytes",
                          "grad_bytes",
                          "optim_bytes",
                          "gflops",
                          "peak_gflops",
                          "mfu",
                          "kernel_s",
                          "gemm_gflops"})
    CHECK(j.contains(key));
  CHECK(j["grad_norm"].is_null());
  CHECK(j["skipped"] == true);
  CHECK(j["step"] == 7);
  CHECK(j["bubble_measured"].size() == 2);
  CHECK_FALSE(j.contains("val_loss"));  // not evaluated
  line.val_loss = 2.5;
  CHECK(nlohmann::json::parse(to_json(line))["val_loss"] == 2.5);
  // loss keeps all 17 digits: resumed runs are compared bit for bit
  line.loss = 0.1 + 0.2;
  CHECK(nlohmann::json::parse(to_json(line))["loss"].get<double>() == 0.1 + 0.2);
}
