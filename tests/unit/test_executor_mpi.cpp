// The executor on two real ranks (mpiexec -n 2): a 2-stage pipeline step against the same model
// run as one process without the executor, and a schedule added through the registry alone,
// validated, planned and run.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>

#include "pipetrain/config/spec.hpp"
#include "pipetrain/data/dataset.hpp"
#include "pipetrain/dist/comm.hpp"
#include "pipetrain/model/model.hpp"
#include "pipetrain/model/partition.hpp"
#include "pipetrain/observe/trace.hpp"
#include "pipetrain/pipeline/executor.hpp"
#include "pipetrain/planner/plan.hpp"
#include "pipetrain/schedule/generators.hpp"
#include "pipetrain/schedule/registry.hpp"
#include "test_world.hpp"

using namespace pipetrain;

namespace {

constexpr int kSteps = 0;  // the data step every comparison reads

RunSpec two_stage_spec(const std::string& schedule) {
  return parse_spec("", "",
                    {"parallel.pp=2", "parallel.schedule=" + schedule, "model.n_layer=4", "parallel.micro_batches=4",
                     "train.global_batch=8"},
                    test_world().size());
}

float grad_scale(const RunSpec& spec) {
  return 1.0f / (static_cast<float>(spec.samples_per_micro_batch()) * spec.model.seq_len * spec.parallel.micro_batches);
}

// Every parameter's gradient by name after one step.
using Grads = std::map<std::string, std::vector<float>>;
Grads grads_by_name(Stage& stage) {
  Grads out;
  for (const ParamTensor& p : stage.params())
    if (!p.tied_copy)
      out[p.name].assign(stage.grads().host().data() + p.offset, stage.grads().host().data() + p.offset + p.size);
  return out;
}

struct StepResult {
  double loss_sum = 0;  // over the step's micro-batches, on the stage holding the head
  Grads grads;
};

// One step of this rank's stage through the executor under `spec`'s schedule. The tied
// embedding's two halves are summed as the training loop does.
StepResult pipeline_step(const RunSpec& spec, Comm& comm) {
  const int P = spec.parallel.pp, M = spec.parallel.micro_batches, s = comm.topo().stage;
  Stage stage(spec, chunks_of(partition_blocks(spec), spec.chunk_placement(), s), P, M, grad_scale(spec));
  stage.init_params(static_cast<uint64_t>(spec.run.seed));
  stage.zero_grads();
  Dataset data(spec);
  std::vector<int> inputs(static_cast<size_t>(spec.samples_per_micro_batch()) * spec.model.seq_len),
      targets(inputs.size());
  Executor executor(stage, comm, step_shape(spec));
  Trace trace;
  const StepStats st = executor.run(spec.parallel.schedule->generate(s, spec.pipeline_shape()), trace, [&](int mb) {
    data.micro_batch(kSteps, 0, mb, inputs.data(), targets.data());
    if (stage.has_embedding()) stage.set_tokens(mb, inputs.data());
    if (stage.has_head()) stage.set_targets(mb, targets.data());
  });
  if (const ParamTensor* wte = stage.find("wte.weight"))
    comm.allreduce_tied(stage.grads().data() + wte->offset, wte->size);
  return {st.loss_sum, grads_by_name(stage)};
}

// The same step as one process: the whole model on one stage, forwards then backwards, no executor.
StepResult one_process_step(const RunSpec& spec) {
  const int M = spec.parallel.micro_batches;
  Stage stage(spec, 0, 1, 0, spec.model.n_layer, M, grad_scale(spec));
  stage.init_params(static_cast<uint64_t>(spec.run.seed));
  stage.zero_grads();
  Dataset data(spec);
  std::vector<int> inputs(static_cast<size_t>(spec.samples_per_micro_batch()) * spec.model.seq_len),
      targets(inputs.size());
  StepResult r;
  for (int mb = 0; mb < M; ++mb) {
    data.micro_batch(kSteps, 0, mb, inputs.data(), targets.data());
    stage.set_tokens(mb, inputs.data());
    stage.set_targets(mb, targets.data());
    r.loss_sum += stage.forward(0, mb, nullptr);
  }
  for (int mb = M - 1; mb >= 0; --mb) stage.backward(0, mb, nullptr, nullptr);
  r.grads = grads_by_name(stage);
  return r;
}

// Largest relative difference between this rank's gradients and the reference's of the same name.
double worst_grad_diff(const Grads& mine, const Grads& reference) {
  double worst = 0;
  for (const auto& [name, g] : mine) {
    const std::vector<float>& ref = reference.at(name);
    REQUIRE(ref.size() == g.size());
    double diff = 0, scale = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      diff = std::max(diff, std::fabs(double{g[i]} - ref[i]));
      scale = std::max(scale, std::fabs(double{ref[i]}));
    }
    worst = std::max(worst, diff / std::max(scale, 1e-30));
  }
  return worst;
}

}  // namespace

TEST_CASE("executor: a 2-stage GPipe step on two ranks gives the one-process loss and gradients", "[executor][mpi]") {
  REQUIRE(test_world().size() == 2);
  const RunSpec spec = two_stage_spec("gpipe");
  Comm comm(test_world(), Topology::of(test_world().rank(), 2, 1), WaitPolicy::automatic, 60);
  const StepResult piped = pipeline_step(spec, comm), alone = one_process_step(spec);
  if (comm.topo().last_stage()) CHECK(piped.loss_sum == Approx(alone.loss_sum).epsilon(1e-6));
  CHECK(!piped.grads.empty());
  CHECK(worst_grad_diff(piped.grads, alone.grads) < 1e-5);
}

TEST_CASE("registry: a schedule added as one entry is validated, planned and run", "[executor][mpi][schedule]") {
  REQUIRE(test_world().size() == 2);
  // GPipe whose backwards run in forward order (B0 first): the same gradients, summed in another order.
  static const ScheduleKind& reversed = register_schedule(
      {"gpipe-forward-order-backward", "gpipe with backwards in forward order (a test schedule)",
       [](int stage, const PipelineShape& s) {
         ActionList list = gpipe_schedule(stage, s.stages, s.micro_batches);
         const auto backwards = std::find_if(
             list.begin(), list.end(), [](const Action& a) { return a.op == Op::recv_grad || a.op == Op::backward; });
         const int per_mb = static_cast<int>(list.end() - backwards) / s.micro_batches;
         std::vector<Action> rest(backwards, list.end());
         for (int i = 0; i < s.micro_batches; ++i)  // the last micro-batch's group first in GPipe: flip the groups
           std::copy(rest.end() - (i + 1) * per_mb, rest.end() - i * per_mb, backwards + i * per_mb);
         return list;
       },
       [](const PipelineShape& s) { return static_cast<double>(s.stages - 1) / (s.micro_batches + s.stages - 1); },
       "closed form (P-1)/(M+P-1)", "one slot per forward or backward"});

  // Validated: the spec key accepts it, and the checks every schedule shares apply to it.
  const RunSpec spec = two_stage_spec(reversed.name);
  CHECK(spec.parallel.schedule == &reversed);
  CHECK_THROWS_WITH(
      parse_spec("", "", {"parallel.pp=2", "parallel.schedule=" + reversed.name, "parallel.virtual_stages=2"}, 2),
      Catch::Contains("parallel.virtual_stages"));
  // Planned: plan simulates its lists and draws them, B0 first on the last stage.
  const Plan plan = make_plan(spec);
  CHECK(plan.bubble_theory == Approx(1.0 / 5));
  CHECK(plan.chart.find("F3  B0  B1  B2  B3") != std::string::npos);
  // Run: two ranks, the same loss and (to rounding) the same gradients as GPipe.
  Comm comm(test_world(), Topology::of(test_world().rank(), 2, 1), WaitPolicy::automatic, 60);
  const StepResult mine = pipeline_step(spec, comm), gpipe = pipeline_step(two_stage_spec("gpipe"), comm);
  CHECK(mine.loss_sum == gpipe.loss_sum);
  CHECK(worst_grad_diff(mine.grads, gpipe.grads) < 1e-5);
}
