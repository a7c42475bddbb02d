// `pipetrain plan --calibrate`: measures this machine's costs for a spec's model with the real
// kernels and writes them as a cost file (planner/costs.hpp) that `plan --costs` and
// `plan --auto` read.
#pragma once
#include <string>

#include "pipetrain/config/spec.hpp"
#include "pipetrain/dist/world.hpp"
#include "pipetrain/planner/costs.hpp"

namespace pipetrain {

// Compute: one block's F, B and W, the embedding's and the head's (a middle, a first and a last
// one-block stage, each pass timed alone, median of 5 after a warm-up), a block's forward and
// recomputing backward under recompute = block and = stage, at micro-batches of 1, 2,
// 4, ... samples up to the spec's global batch (and at most 16384 tokens); every rank measures at
// once, as ranks of one node compute at once in training, and the figures are averaged; the sweep
// over sizes runs 3 times and each figure is the median of the three. The update (zeroing
// gradients, their norm, AdamW) per parameter. With two or more ranks also a message between
// ranks 0 and 1 (half a round trip) and an all-reduce over all ranks, 4 KiB to 64 MiB.
MachineCosts calibrate(const RunSpec& spec, World& world);

}  // namespace pipetrain
