// The planner's cost model: a cost file's curves (interpolated between measured sizes, proportional
// beyond them), all-reduce scaling with the group, costs from a peak following our kernels' FLOPs,
// and a predicted step that is the simulated pipeline plus reduction and AdamW.
#include <catch2/catch.hpp>

#include "pipetrain/config/spec.hpp"
#include "pipetrain/planner/costs.hpp"
#include "pipetrain/planner/step_time.hpp"
#include "pipetrain/schedule/registry.hpp"

using namespace pipetrain;

namespace {

MachineCosts two_sizes() {
  MachineCosts c;
  c.d_model = 64;
  c.n_head = 4;
  c.seq_len = 32;
  c.vocab = 256;
  c.compute = {{1, {1, 2, 1}, {0, 0, 0}, {0, 0, 0}, {}}, {4, {3, 6, 3}, {0, 0, 0}, {0, 0, 0}, {}}};
  c.p2p = {{1000, 1e-3}, {2000, 2e-3}};
  c.allreduce = {{1000, 4e-3}, {2000, 8e-3}};
  c.allreduce_ranks = 2;
  return c;
}

}  // namespace

TEST_CASE("costs: linear between measured sizes, proportional beyond, latency below the smallest", "[costs]") {
  const MachineCosts c = two_sizes();
  CHECK(c.block(1).f == Approx(1));
  CHECK(c.block(2).f == Approx(1 + 2.0 / 3));  // a third of the way from 1 to 4 samples
  CHECK(c.block(8).b == Approx(12));           // twice the largest measured
  CHECK(c.p2p_s(1500) == Approx(1.5e-3));
  CHECK(c.p2p_s(10) == Approx(1e-3));  // latency-bound
  CHECK(c.allreduce_s(1000, 1) == 0);
  CHECK(c.allreduce_s(1000, 2) == Approx(4e-3));
  CHECK(c.allreduce_s(1000, 4) == Approx(4e-3 * 1.5));  // 2(D-1)/D: 1 at D = 2, 1.5 at D = 4
  // Not measured: a recomputing backward is the forward again plus the backward.
  CHECK(c.block_under(Recompute::block, 1).b == Approx(1 + 3));
  const MachineCosts back = MachineCosts::from_json(c.to_json(), "round trip");
  CHECK(back.block(2).f == Approx(c.block(2).f));
  CHECK(back.allreduce_s(1500, 8) == Approx(c.allreduce_s(1500, 8)));
}

TEST_CASE("costs: a file that is not one is refused naming it", "[costs]") {
  CHECK_THROWS_WITH(MachineCosts::from_json(nlohmann::json{{"source", "x"}}, "f.json"),
                    Catch::Contains("f.json: not a cost file"));
  nlohmann::json j = two_sizes().to_json();
  j["compute"][0]["block"]["f"] = -1;
  CHECK_THROWS_WITH(MachineCosts::from_json(j, "f.json"), Catch::Contains("non-positive"));
  RunSpec other;
  other.model.d_model = 128;
  CHECK_THROWS_WITH(two_sizes().check_fits(other, "f.json"), Catch::Contains("measured on d_model 64"));
}

TEST_CASE("costs from a peak: each pass at our kernels' FLOPs, messages at the link's bandwidth", "[costs]") {
  RunSpec spec;  // tiny: C 64, T 32, V 256
  const MachineCosts c = MachineCosts::from_peak(spec, 1e12, 0.5, 1e9);
  const double C = 64, T = 32, V = 256, rate = 0.5e12;
  CHECK(c.block(2).f == Approx(2 * T * (24 * C * C + 4 * T * C) / rate));
  CHECK(c.head(1).b == Approx(T * 2 * C * V / rate));
  CHECK(c.p2p_s(1e6) == Approx(10e-6 + 1e6 / 1e9).epsilon(1e-6));
}

TEST_CASE(
    "predicted step: the simulated pipeline, then reduction, the step agreement and the update on the slowest rank",
    "[costs]") {
  RunSpec spec;  // 4 blocks, M = 4, global batch 16: 4 samples per micro-batch on 1 replica
  spec.parallel.pp = 2;
  spec.model.tie_embeddings = false;  // tied, the two stages would also sum wte's gradient
  MachineCosts c = two_sizes();       // no embedding or head cost, free messages
  c.p2p.clear();
  c.adamw_s_per_param = 0;
  const StepPrediction p = predict_step(spec, c);
  // Two blocks per stage: F = 6, backward = 2 x (6 + 3) = 18 per micro-batch; GPipe with M = 4:
  // (M + P - 1) x (F + backward) = 5 x 24. Then the step agreement, a 24-byte all-reduce over both.
  const double agree = c.allreduce_s(3 * sizeof(double), 2);
  CHECK(agree == Approx(4e-3));
  CHECK(p.pipeline_s == Approx(120));
  CHECK(p.step_s == Approx(120 + agree));
  // Each stage works 4 x 24 + the agreement and waits the rest, as bubble_measured counts it.
  CHECK(p.bubble == Approx(1 - (96 + agree) / (120 + agree)));
  CHECK(p.tokens_per_s == Approx(16.0 * 32 / (120 + agree)));
  spec.model.tie_embeddings = true;
  CHECK(predict_step(spec, c).reduce_s == Approx(c.allreduce_s(4.0 * 256 * 64, 2)));  // wte's gradient, 2 ranks
  spec.model.tie_embeddings = false;
  spec.parallel.dp = 2;
  spec.parallel.pp = 1;
  spec.parallel.micro_batches = 2;  // 4 samples each, 4 blocks
  c.adamw_s_per_param = 1e-9;
  const StepPrediction d = predict_step(spec, c);
  CHECK(d.reduce_s > 0);
  CHECK(d.step_s == Approx(d.pipeline_s + d.reduce_s + d.optimizer_s));
  spec.parallel.zero = 1;
  CHECK(predict_step(spec, c).optimizer_s - agree == Approx((d.optimizer_s - agree) / 2));  // each replica updates half
}

TEST_CASE("predicted step with tensor ranks: a tp-th of each pass plus the tensor group's all-reduces", "[costs]") {
  RunSpec spec;  // 4 blocks, M = 4 micro-batches of 4 samples, one stage
  spec.model.tie_embeddings = false;
  MachineCosts c = two_sizes();  // no embedding or head cost
  c.p2p.clear();
  const StepPrediction whole = predict_step(spec, c);
  spec.parallel.tp = 2;
  const StepPrediction split = predict_step(spec, c);
  // A micro-batch's activation: 4 samples x 32 tokens x 64 floats; per micro-batch 4 sums in each
  // of 4 blocks, 1 in the embedding's forward, 1 in the head's backward.
  const double bytes = 4.0 * 4 * 32 * 64, sum = c.allreduce_s(bytes, 2);
  CHECK(split.tp_sum_bytes == bytes);
  CHECK(split.tp_comm_s == Approx(4 * (4 * 4 + 2) * sum));
  CHECK(split.pipeline_s == Approx(whole.pipeline_s / 2 + split.tp_comm_s));
  spec.parallel.recompute = Recompute::block;  // each block's forward runs again in its backward, sums too
  CHECK(predict_step(spec, c).tp_comm_s == Approx(4 * (4 * 6 + 2) * sum));
}

TEST_CASE("predicted step with sequence parallelism: the backward gathers the norms' outputs again", "[costs]") {
  RunSpec spec;  // 4 blocks, M = 4 micro-batches of 4 samples, one stage, tp 2
  spec.model.tie_embeddings = false;
  spec.parallel.tp = 2;
  MachineCosts c = two_sizes();
  c.p2p.clear();
  const StepPrediction plain = predict_step(spec, c);
  spec.parallel.sequence_parallel = true;
  const StepPrediction sp = predict_step(spec, c);
  const double sum = c.allreduce_s(4.0 * 4 * 32 * 64, 2);
  // Per micro-batch: a block 4 sums + 1 of gathers again; the embedding 1.5, the head 2.
  CHECK(sp.tp_comm_s == Approx(4 * (4 * 5 + 1.5 + 2) * sum));
  CHECK(sp.pipeline_s - plain.pipeline_s == Approx(sp.tp_comm_s - plain.tp_comm_s));
}
