// `pipetrain plan`: what a layout will do, predicted without launching it (no MPI): partition,
// the schedule's slot chart (stages x time slots, the classic GPipe diagram), bubble from simulating the actual action
// lists with per-stage costs next to (P-1)/(M+P-1), and per-stage memory for every recompute mode.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipetrain/config/spec.hpp"
#include "pipetrain/planner/costs.hpp"

namespace pipetrain {

struct StagePlan {
  int blocks = 0;
  size_t params = 0;        // floats of the stage's tensors (the tensor rank's parts)
  size_t shard_floats = 0;  // the fullest replica's row slab of every tensor: what sharded state keeps of each
  // ZeRO-3 with parallel.reshard_after_forward: the most whole weights present at once (the layer a
  // pass reads and the one gathered ahead of it).
  size_t layer_floats = 0;
  // Its chunks run more than one backward a step (M > 1): gradients accumulate in the whole
  // buffer until the last. With one, ZeRO-2 and 3 release each tensor's whole gradient once its
  // reduce-scatter completes, so only the layers in flight are whole at once.
  bool accumulates = true;
  // What a rank of this stage keeps at parallel.zero = `zero` (as it acts: 0 at dp = 1), in bytes:
  // at the step's peak and between steps. Weights: whole, or (3) the master slab plus what is
  // gathered; gradients: whole during the step (2, 3 without accumulation: the layers in flight),
  // and (2, 3) the summed slab, all that stays after it; AdamW's two moments: whole, or (1-3) the
  // slab's.
  struct State {
    double weights = 0, grads = 0, optim = 0;  // at the step's peak
    double weights_held = 0, grads_held = 0;   // between steps
    double startup = 0;  // while the weights are initialised or loaded whole (ZeRO-3: as the slabs are taken)
    double total() const { return weights + grads + optim; }
    double held() const { return weights_held + grads_held + optim; }
  };
  State state_at(int zero, bool reshard) const;
  size_t snapshot_bytes = 0;  // checkpoint.async's host copy on the fullest replica: its slab of weights and moments
  double cost_share = 0;      // of the summed stage costs
  double bubble = 0;          // simulated with the cost model
  int in_flight = 0;          // micro-batches whose activations the schedule holds at its peak
  size_t act_peak_bytes[3];   // by recompute mode: none, stage, block
  size_t act_held_bytes[3];   // what the stage's reused activation buffers keep allocated (held_activation_bytes)
  size_t working_bytes = 0;   // scratch and buffers for the spec's recompute mode (and bf16 copies)
  // With replicas, MPI's scratch for the gradient reduction: unsharded, (D-1)/D of the gradients
  // (measured with MPICH at D = 2); sharded, each travelling reduce-scatter's own part (1/D) of at
  // most OptimizerShard::reduce_window floats.
  size_t reduce_scratch_bytes = 0;
  // Weights, gradients, AdamW at the step's peak (the spec's zero), an asynchronous save's snapshot.
  double state_bytes(const RunSpec& spec) const;
  // All a rank of this stage needs under the spec: the state, the activation buffers held under
  // its recompute mode, working buffers (the kernels' scratch among them) and the reduction's scratch.
  double memory_bytes(const RunSpec& spec) const;
};

struct Plan {
  int world = 0;
  std::vector<StagePlan> stages;
  double bubble_theory = 0, bubble_sim = 0;
  double step_units = 0;  // the simulated step with the cost model (per-token FLOP units; compares layouts of one M)
  std::string chart;      // unit-slot diagram, "" when too wide to draw
  double largest_memory_bytes(const RunSpec& spec) const;  // the fullest stage's memory_bytes
};

Plan make_plan(const RunSpec& spec);
// "interleaved (2 chunks per stage)", "gpipe": the schedule as the start line and plan show it.
std::string schedule_description(const RunSpec& spec);
std::string plan_text(const RunSpec& spec, const Plan& plan);
nlohmann::json plan_json(const RunSpec& spec, const Plan& plan);
// What a step and the run cost on a machine, the answer to "should I burn the GPU hours": FLOPs
// and bytes per step, the predicted step time and tokens/s with `costs`, wall time and
// device-hours for run.steps, and memory per rank against `memory_per_rank` (0: not given).
std::string budget_text(const RunSpec& spec, const Plan& plan, const MachineCosts& costs, double memory_per_rank);
nlohmann::json budget_json(const RunSpec& spec, const Plan& plan, const MachineCosts& costs, double memory_per_rank);
// Where the bubble simulated with the cost model is far above the schedule's even-stage figure:
// the cause (the heaviest chunk, e.g. the one carrying the LM head) and the partition or chunk
// count that lowers the simulated step most, as a --set line (or that none does).
struct ImbalanceWarning {
  std::string cause, advice;
};
std::optional<ImbalanceWarning> imbalance_warning(const RunSpec& spec, const Plan& plan);
// Every schedule on this spec's layout side by side: bubble with even stages and with the cost
// model, micro-batches held per stage, activation peak (the spec's recompute mode).
std::string schedule_comparison(const RunSpec& spec);

}  // namespace pipetrain
