// The step boundary on two real ranks as two data-parallel replicas (mpiexec -n 2): bucketed
// gradient all-reduce; ZeRO-1's per-tensor reduce-scatter (each rank's summed slab in place) and
// all-gather of updated slabs; and the one agreement that makes every rank decide alike on the
// update (NaN anywhere: no rank applies it) and on stopping, in both modes.
#include <catch2/catch.hpp>

#include <cmath>
#include <numeric>

#include "pipetrain/config/spec.hpp"
#include "pipetrain/dist/comm.hpp"
#include "pipetrain/train/grad_sync.hpp"
#include "test_world.hpp"

using namespace pipetrain;

namespace {

Comm& replicas() {  // pp 1 x dp 2: the two ranks are one stage's replicas
  static Comm comm(test_world(), Topology::of(test_world().rank(), 1, 2), WaitPolicy::automatic, 60);
  return comm;
}

RunSpec tiny_replicated() {
  return parse_spec("", "", {"parallel.dp=2", "model.n_layer=1", "model.d_model=8", "model.n_head=2"}, 2);
}

// Three tensors over 23 floats: 3 rows of 3, 5 rows of 2, 4 single elements.
std::vector<ParamTensor> three_tensors() {
  std::vector<ParamTensor> p(3);
  p[0].name = "a";
  p[0].shape = {3, 3};
  p[0].offset = 0;
  p[0].size = 9;
  p[1].name = "b";
  p[1].shape = {5, 2};
  p[1].offset = 9;
  p[1].size = 10;
  p[2].name = "c";
  p[2].shape = {4};
  p[2].offset = 19;
  p[2].size = 4;
  return p;
}

}  // namespace

// Through a host copy (`through_host`), each bucket or tensor is downloaded and its collective
// posted once it arrives: the GPU's path, whose downloads are plain copies on the CPU.
TEST_CASE("grad sync: buckets cut from the end sum every element over the replicas", "[grad_sync][mpi]") {
  REQUIRE(test_world().size() == 2);
  const int rank = test_world().rank();
  const std::vector<ParamTensor> params = three_tensors();
  const OptimizerShard whole(params, 0, 1);
  Trace no_trace;  // records nothing
  for (bool through_host : {false, true})
    for (size_t bucket : {size_t{1}, size_t{3}, size_t{7}, size_t{1000}}) {
      std::vector<float> grads(23), host(23, -1.0f);
      for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(i + 100 * rank);
      float* summed = through_host ? host.data() : grads.data();
      GradReducer reducer(replicas(), grads.data(), summed, grads.size(), bucket, params, whole, nullptr);
      reducer.begin_step();
      for (size_t offset : {size_t{20}, size_t{20}, size_t{11}, size_t{4}})
        reducer.done_from(offset);  // as backward reports
      reducer.finish(no_trace);
      INFO("bucket " << bucket << (through_host ? ", through a host copy" : ""));
      for (size_t i = 0; i < grads.size(); ++i) CHECK(summed[i] == static_cast<float>(2 * i + 100));
    }
}

TEST_CASE("grad sync: ZeRO-1 leaves each rank its slab of every tensor summed, and gathers updated slabs back",
          "[grad_sync][zero][mpi]") {
  REQUIRE(test_world().size() == 2);
  const int rank = test_world().rank();
  const std::vector<ParamTensor> params = three_tensors();
  const OptimizerShard mine(params, rank, 2);
  Trace no_trace;
  std::vector<float> grads(23);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(i + 100 * rank);
  GradReducer reducer(replicas(), grads.data(), grads.data(), grads.size(), 4, params, mine, nullptr);
  reducer.begin_step();
  for (size_t offset : {size_t{20}, size_t{19}, size_t{11}, size_t{9}, size_t{0}}) reducer.done_from(offset);
  reducer.finish(no_trace);
  for (const OptimizerShard::Slab& s : mine.slabs()) {
    INFO("tensor " << params[s.tensor].name << " rank " << rank);
    CHECK(s.size() > 0);
    for (size_t i = s.begin; i < s.end; ++i) CHECK(grads[i] == static_cast<float>(2 * i + 100));
  }

  // Each rank "updates" its slabs (to 1000 + index); the gather brings every slab to both.
  const RunSpec spec = parse_spec("", "", {"parallel.dp=2", "model.n_layer=1", "model.d_model=8", "model.n_head=2"}, 2);
  Stage stage(spec, 0, 1, 0, 1, spec.parallel.micro_batches, 1.0f);
  const OptimizerShard stage_shard(stage.params(), rank, 2);
  auto& w = stage.weights().host();
  std::fill(w.begin(), w.end(), -1.0f);
  for (const OptimizerShard::Slab& s : stage_shard.slabs())
    for (size_t i = s.begin; i < s.end; ++i) w[i] = 1000.0f + static_cast<float>(i);
  ParamGather gather(replicas(), stage, stage_shard, nullptr);
  gather.post();
  CHECK(gather.wait(0));
  CHECK_FALSE(gather.wait(0));  // nothing left to wait for
  for (size_t i = 0; i < w.size(); ++i) CHECK(w[i] == 1000.0f + static_cast<float>(i));
}

TEST_CASE("grad sync: sharded, no more than the window's gradient floats travel at once", "[grad_sync][mpi]") {
  REQUIRE(test_world().size() == 2);
  const RunSpec spec =
      parse_spec("", "", {"parallel.dp=2", "model.n_layer=6", "model.d_model=32", "model.n_head=2"}, 2);
  Stage stage(spec, 0, 1, 0, 1, spec.parallel.micro_batches, 1.0f);
  auto& g = stage.grads().host();
  const size_t bucket = 5, window = OptimizerShard::reduce_window(stage.params(), bucket);
  REQUIRE(window < g.size());  // whole, the backward's tensors would pass it
  Trace no_trace;
  std::vector<float> host(g.size());
  for (bool through_host : {false, true})
    for (int zero : {1, 2}) {
      INFO("zero = " << zero << (through_host ? ", through a host copy" : ""));
      AdamW adam(spec.train, OptimizerShard(stage.params(), test_world().rank(), 2, zero));
      GradReducer reducer(replicas(), g.data(), through_host ? host.data() : g.data(), g.size(), bucket, stage.params(),
                          adam.shard(), nullptr, zero == 2 ? adam.grad_shard().data() : nullptr);
      std::fill(g.begin(), g.end(), 0.5f);
      std::fill(host.begin(), host.end(), -1.0f);
      reducer.begin_step();
      reducer.done_from(0);  // every tensor at once, the last first
      CHECK(reducer.most_travelling() <= window);
      CHECK(reducer.most_travelling() > 0);
      reducer.finish(no_trace);
      const float* summed = zero == 2 ? adam.grad_shard().data() : through_host ? host.data() : g.data();
      for (const OptimizerShard::Slab& s : adam.shard().slabs()) {
        const size_t at = zero == 2 ? s.state_offset : s.begin;
        CHECK(std::all_of(summed + at, summed + at + s.size(), [](float v) { return v == 1.0f; }));
      }
    }
}

TEST_CASE("grad sync: the norm covers the summed gradient, and a NaN or stop on one rank holds for all",
          "[grad_sync][mpi]") {
  REQUIRE(test_world().size() == 2);
  const int rank = test_world().rank();
  const RunSpec spec = tiny_replicated();
  Stage stage(spec, 0, 1, 0, 1, spec.parallel.micro_batches, 1.0f);
  auto& g = stage.grads().host();
  Trace no_trace;  // records nothing
  for (int zero : {0, 1, 2}) {
    INFO("zero = " << zero);
    AdamW adam(spec.train, OptimizerShard(stage.params(), zero ? rank : 0, zero ? 2 : 1, zero));
    const OptimizerShard& shard = adam.shard();
    GradReducer reducer(replicas(), g.data(), g.data(), g.size(), 5, stage.params(), shard, nullptr,
                        zero == 2 ? adam.grad_shard().data() : nullptr);

    // Each replica holds half of a gradient of ones: after the sum every element (of the rank's
    // slabs, sharded; under ZeRO-2 in the optimizer's compact copy) is 1, and the global norm
    // counts each element once.
    std::fill(g.begin(), g.end(), 0.5f);
    reducer.begin_step();
    StepSync sync = sync_step(stage, replicas(), reducer, adam, nullptr, false, RootSays{}, 1.0, no_trace);
    CHECK(sync.finite);
    CHECK_FALSE(sync.stop);
    CHECK_FALSE(sync.window_long_enough);
    CHECK(sync.straggler_act == StragglerAction::log);
    CHECK(sync.norm == Approx(std::sqrt(static_cast<double>(g.size()))));
    const auto& summed = zero == 2 ? adam.grad_shard().host() : g;
    for (const OptimizerShard::Slab& s : shard.slabs()) {
      const size_t at = zero == 2 ? s.state_offset : s.begin;
      CHECK(std::all_of(summed.begin() + at, summed.begin() + at + s.size(), [](float v) { return v == 1.0f; }));
    }

    // A NaN in one replica's gradient: both skip the update.
    std::fill(g.begin(), g.end(), 0.5f);
    if (rank == 1) g[g.size() / 2] = NAN;
    reducer.begin_step();
    sync = sync_step(stage, replicas(), reducer, adam, nullptr, false, RootSays{}, 1.0, no_trace);
    CHECK_FALSE(sync.finite);

    // A NaN in one rank's loss only: both skip too.
    std::fill(g.begin(), g.end(), 0.5f);
    reducer.begin_step();
    sync = sync_step(stage, replicas(), reducer, adam, nullptr, false, RootSays{}, rank == 0 ? NAN : 1.0, no_trace);
    CHECK_FALSE(sync.finite);

    // One rank out of time: both stop. Rank 0 says the straggler window is long enough: both close it.
    std::fill(g.begin(), g.end(), 0.5f);
    reducer.begin_step();
    // It also says what straggler move to make after the step: both learn it.
    RootSays root;
    if (rank == 0) root = {true, StragglerAction::rebalance};
    sync = sync_step(stage, replicas(), reducer, adam, nullptr, rank == 1, root, 1.0, no_trace);
    CHECK(sync.stop);
    CHECK(sync.finite);
    CHECK(sync.window_long_enough);
    CHECK(sync.straggler_act == StragglerAction::rebalance);
  }
}
