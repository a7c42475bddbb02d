// A cost file from a finished run: what its trace measured, for `plan --costs RUN_DIR` and
// `plan --calibrate --from-run RUN_DIR` on a machine where calibrating is not possible or a run
// already says more (the real layout, the real neighbours on the node).
#pragma once
#include <string>

#include "pipetrain/planner/costs.hpp"

namespace pipetrain {

// Reads RUN_DIR/config.toml and RUN_DIR/trace.json (log.trace_steps > 0; its first step is left
// out when it has more). Per virtual stage, the median forward, backward (input and weight halves
// where the schedule split them; a fused one is split in its FLOPs' proportions) and recompute
// span. A stage holding neither embedding nor head gives a block's time directly, and the first
// and last stages' remainders the embedding's and the head's; a run with no such stage shares each
// stage's time out in FLOP proportions. The update per parameter from the spans that zero the
// gradients, take their norm and run AdamW. One micro-batch
// size (the run's); no message costs (the waits mix transfers with bubbles). Throws SpecError naming
// the file that is missing or unusable.
MachineCosts costs_from_run(const std::string& run_dir);

}  // namespace pipetrain
