// The step boundary on two real ranks as two data-parallel replicas (mpiexec -n 2): bucketed
// gradient all-reduce, and the one agreement that makes every rank decide alike on the update
// (NaN anywhere: no rank applies it) and on stopping.
#include <catch2/catch.hpp>

#include <cmath>
#include <numeric>

#include "pipetrain/config/spec.hpp"
#include "pipetrain/dist/comm.hpp"
#include "test_world.hpp"
#include "pipetrain/train/grad_sync.hpp"

using namespace pipetrain;

namespace {

Comm& replicas() {  // pp 1 x dp 2: the two ranks are one stage's replicas
  static Comm comm(test_world(), Topology::of(test_world().rank(), 1, 2), WaitPolicy::automatic, 60);
  return comm;
}

RunSpec tiny_replicated() {
  return parse_spec("", "", {"parallel.dp=2", "model.n_layer=1", "model.d_model=8", "model.n_head=2"}, 2);
}

}  // namespace

TEST_CASE("grad sync: buckets cut from the end sum every element over the replicas", "[grad_sync][mpi]") {
  REQUIRE(test_world().size() == 2);
  const int rank = test_world().rank();
  for (size_t bucket : {size_t{1}, size_t{3}, size_t{7}, size_t{1000}}) {
    std::vector<float> grads(23);
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(i + 100 * rank);
    GradReducer reducer(replicas(), grads, bucket);
    reducer.begin_step();
    for (size_t offset : {size_t{20}, size_t{20}, size_t{11}, size_t{4}}) reducer.done_from(offset);  // as backward reports
    reducer.finish();
    INFO("bucket " << bucket);
    for (size_t i = 0; i < grads.size(); ++i) CHECK(grads[i] == static_cast<float>(2 * i + 100));
  }
}

TEST_CASE("grad sync: the norm covers the summed gradient, and a NaN or stop on one rank holds for all", "[grad_sync][mpi]") {
  REQUIRE(test_world().size() == 2);
  const int rank = test_world().rank();
  const RunSpec spec = tiny_replicated();
  Stage stage(spec, 0, 1, 0, 1, spec.parallel.micro_batches, 1.0f);
  std::vector<float>& g = stage.grads().host();
  const size_t bucket = 5;

  // Each replica holds half of a gradient of ones: after the sum every element is 1.
  std::fill(g.begin(), g.end(), 0.5f);
  GradReducer reducer(replicas(), g, bucket);
  reducer.begin_step();
  Trace no_trace;  // records nothing
  StepSync sync = sync_step(stage, replicas(), &reducer, nullptr, nullptr, false, 1.0, no_trace);
  CHECK(sync.finite);
  CHECK_FALSE(sync.stop);
  CHECK(sync.norm == Approx(std::sqrt(static_cast<double>(g.size()))));
  CHECK(std::all_of(g.begin(), g.end(), [](float v) { return v == 1.0f; }));

  // A NaN in one replica's gradient: both skip the update.
  std::fill(g.begin(), g.end(), 0.5f);
  if (rank == 1) g[g.size() / 2] = NAN;
  reducer.begin_step();
  sync = sync_step(stage, replicas(), &reducer, nullptr, nullptr, false, 1.0, no_trace);
  CHECK_FALSE(sync.finite);

  // A NaN in one rank's loss only: both skip too.
  std::fill(g.begin(), g.end(), 0.5f);
  reducer.begin_step();
  sync = sync_step(stage, replicas(), &reducer, nullptr, nullptr, false, rank == 0 ? NAN : 1.0, no_trace);
  CHECK_FALSE(sync.finite);

  // One rank out of time: both stop.
  std::fill(g.begin(), g.end(), 0.5f);
  reducer.begin_step();
  sync = sync_step(stage, replicas(), &reducer, nullptr, nullptr, rank == 1, 1.0, no_trace);
  CHECK(sync.stop);
  CHECK(sync.finite);
}
