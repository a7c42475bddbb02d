// A step's time on a machine, predicted: every rank's action list simulated with the machine's
// per-pass costs (planner/costs.hpp) and message time; then each rank's data-parallel gradient
// reduction, posted bucket by bucket during its last backwards so that only what is left after
// them waits (reduce_overlap.hpp), the tied-embedding sum and AdamW. Under ZeRO-3 each pass also
// waits for whatever of its layers' all-gathers the layer before does not hide. With tensor ranks a pass
// computes a tp-th of its products and adds the tensor-group exchanges layer_decl.hpp declares
// for it, at the measured all-reduce's cost (a tensor group shares a node: the costs' link is the
// node's). Under expert parallelism an MoE block's passes add their all-to-alls, priced on the
// costs' link with the router spreading rows evenly.
#pragma once
#include "pipetrain/config/spec.hpp"
#include "pipetrain/planner/costs.hpp"

namespace pipetrain {

struct StepPrediction {
  double step_s = 0;      // the slowest rank's
  double pipeline_s = 0;  // the forwards and backwards (the simulated makespan)
  double bubble = 0;      // share of the step a rank waits for others, mean over ranks (as bubble_measured)
  double reduce_s = 0;    // gradient reduction (+ parameter gather under zero = 1, 2, + tied sum) of the slowest rank
  double reduce_exposed_s = 0;  // of it, what its backward does not hide: the step waits for it
  // ZeRO-3's layer gathers per step on the rank with the most, and what of them the passes do not
  // hide (part of pipeline_s: a pass waits for its layer's weights).
  double gather_s = 0, gather_exposed_s = 0;
  double optimizer_s = 0;  // AdamW on the slowest rank
  double tokens_per_s = 0;
  double flops = 0;         // per step, the whole job (recompute's extra forwards included)
  double p2p_bytes = 0;     // pipeline messages per step, the whole job (a rank's messages to itself not counted)
  double reduce_bytes = 0;  // gradients summed over replicas per step, the whole job
  double tp_comm_s = 0;     // the tensor group's sums per step, on the rank with the most (0 at tp 1)
  double tp_sum_bytes = 0;  // one of them: a micro-batch's activation, summed over its tp ranks' link
  double ep_comm_s = 0;     // expert parallelism's all-to-alls per step, on the rank with the most (0 at ep 1)
};

StepPrediction predict_step(const RunSpec& spec, const MachineCosts& costs);

}  // namespace pipetrain
