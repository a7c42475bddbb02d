// The planner's cost model: a cost file's curves (interpolated between measured sizes, proportional
// beyond them), all-reduce scaling with the group, costs from a peak following our kernels' FLOPs,
// and a predicted step that is the simulated pipeline plus reduction and AdamW.
#include <catch2/catch.hpp>

#include "pipetrain/config/spec.hpp"
#include "pipetrain/planner/costs.hpp"
#include "pipetrain/planner/reduce_overlap.hpp"
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
  MachineCosts refill = c;
  refill.gather_refill = {{2000, 3e-3}, {1000, 1e-3}};
  const MachineCosts back = MachineCosts::from_json(refill.to_json(), "round trip");
  CHECK(back.block(2).f == Approx(c.block(2).f));
  CHECK(back.allreduce_s(1500, 8) == Approx(c.allreduce_s(1500, 8)));
  CHECK(back.gather_refill_s(1500) == Approx(2e-3));  // sorted by size as read
  CHECK(MachineCosts::from_json(c.to_json(), "without").gather_refill_s(1500) == 0);
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
  // of 4 blocks, 1 in the embedding's forward, 1 in the head's backward; and the split
  // vocabulary's loss: a float (row maximum) and two doubles (sums) per token, in the head's forward.
  const double bytes = 4.0 * 4 * 32 * 64, sum = c.allreduce_s(bytes, 2);
  const double loss = c.allreduce_s(4.0 * 128, 2) + c.allreduce_s(16.0 * 128, 2);
  CHECK(split.tp_sum_bytes == bytes);
  CHECK(split.tp_comm_s == Approx(4 * ((4 * 4 + 2) * sum + loss)));
  CHECK(split.pipeline_s == Approx(whole.pipeline_s / 2 + split.tp_comm_s));
  spec.parallel.recompute = Recompute::block;  // each block's and the head's forward run again, sums too
  CHECK(predict_step(spec, c).tp_comm_s == Approx(4 * ((4 * 6 + 2) * sum + 2 * loss)));
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
  const double loss = c.allreduce_s(4.0 * 128, 2) + c.allreduce_s(16.0 * 128, 2);
  // Per micro-batch, in all-reduces of the activation (an all-gather or a reduce-scatter is half
  // of one): a block's forward gathers 2 and scatters 2 (2), its backward the same (2) and gathers
  // ln1 and ln2 again (1); the embedding scatters its forward (0.5) and gathers its input gradient
  // (0.5); the head gathers ln_f in its forward and backward (1) and scatters ln_f's gradient (0.5).
  CHECK(sp.tp_comm_s == Approx(4 * ((4 * 5 + 1 + 1.5) * sum + loss)));
  CHECK(sp.pipeline_s - plain.pipeline_s == Approx(sp.tp_comm_s - plain.tp_comm_s));
}

TEST_CASE("gradient buckets posted during the last backward hide behind it: only what is left after it is exposed",
          "[costs]") {
  // Two chunks' last backwards: [0, 10] finishing 100 floats, then [10, 20] finishing 100 more.
  const std::vector<FinishingChunk> chunks{{0, 10, 100}, {10, 20, 100}};
  auto one_s_per_50_floats = [](double bytes) { return bytes / 4 / 50; };
  // Buckets of 50 floats: final at 5, 10, 15, 20; each takes 1 s on the link: done at 6, 11, 16, 21.
  ReduceTiming t = overlap_reduction(chunks, 20, {50, 50, 50, 50}, one_s_per_50_floats);
  CHECK(t.total_s == Approx(4));
  CHECK(t.exposed_s == Approx(1));
  // A slow link queues them: 6 s each, the first from 5, each next as the link frees: 11, 17, 23,
  // done at 29: 9 s after the backward.
  auto slow = [](double bytes) { return bytes / 4 / 50 * 6; };
  t = overlap_reduction(chunks, 20, {50, 50, 50, 50}, slow);
  CHECK(t.total_s == Approx(24));
  CHECK(t.exposed_s == Approx(9));
  // One bucket of everything: posted at the end, all of it exposed.
  t = overlap_reduction(chunks, 20, {200}, one_s_per_50_floats);
  CHECK(t.exposed_s == Approx(t.total_s));
  CHECK(t.total_s == Approx(4));
}

TEST_CASE("predicted step: data-parallel buckets overlap the backward, the exposed part is what the step waits for",
          "[costs]") {
  RunSpec spec;  // 4 blocks, 2 replicas, one stage
  spec.model.tie_embeddings = false;
  spec.parallel.dp = 2;
  spec.parallel.micro_batches = 2;
  MachineCosts c = two_sizes();
  c.p2p.clear();
  c.adamw_s_per_param = 0;
  spec.comm.bucket_mb = 64;  // one bucket: posted after the backward, all of it exposed
  const StepPrediction whole = predict_step(spec, c);
  CHECK(whole.reduce_exposed_s == Approx(whole.reduce_s));
  spec.comm.bucket_mb = 0.0625;  // many: all but the last hide behind the last backward
  const StepPrediction buckets = predict_step(spec, c);
  CHECK(buckets.reduce_s == Approx(whole.reduce_s).epsilon(0.05));
  CHECK(buckets.reduce_exposed_s < 0.5 * buckets.reduce_s);
  CHECK(buckets.step_s == Approx(buckets.pipeline_s + buckets.reduce_exposed_s + buckets.optimizer_s));
}

TEST_CASE("predicted step under ZeRO-3 on a CPU: every layer gather costs the measured refill, none of it hidden",
          "[costs]") {
  RunSpec spec;  // 4 blocks, C 64, T 32, V 256, one stage
  spec.model.tie_embeddings = false;
  spec.parallel.dp = 2;
  spec.parallel.micro_batches = 2;
  spec.parallel.zero = 3;  // at pp 1 resharded after every pass
  MachineCosts c = two_sizes();
  c.p2p.clear();
  c.adamw_s_per_param = 0;
  const StepPrediction beside = predict_step(spec, c);
  c.gather_refill = {{1, 1e-6}, {1000, 1e-3}};  // 1 us a byte
  const StepPrediction cores = predict_step(spec, c);
  // Bytes a layer gathers: a block 12 C^2 + 13 C floats, the embedding wte + wpe (V C + T C), the
  // head ln_f + lm_head (2 C + V C). A micro-batch's forward gathers all of them, its backward the
  // head and the blocks.
  const double C = 64, block = 4 * (12 * C * C + 13 * C), embed = 4 * (256 * C + 32 * C), head = 4 * (2 * C + 256 * C);
  const double per_micro_batch = (embed + 4 * block + head) + (head + 4 * block);
  CHECK(cores.gather_s == Approx(2 * per_micro_batch * 1e-6));
  CHECK(cores.gather_exposed_s == Approx(cores.gather_s));
  CHECK(beside.gather_exposed_s < 0.5 * beside.gather_s);  // beside compute, most hide
  CHECK(cores.step_s > beside.step_s + 0.9 * (cores.gather_exposed_s - beside.gather_exposed_s));
  // One all-gather per tensor, each at least the latency: a micro-batch's forward gathers wte and
  // wpe, 12 tensors per block and ln_f's two and lm_head; its backward the head's and the blocks'.
  c.gather_refill = {{1e9, 1e-3}};
  CHECK(predict_step(spec, c).gather_s == Approx(2 * ((2 + 4 * 12 + 3) + (3 + 4 * 12)) * 1e-3));
}
