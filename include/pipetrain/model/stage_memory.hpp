// What a stage's buffers hold, in bytes, computed from the layers' declared buffers (layer_decl.hpp)
// under each recompute mode's lifetimes: the figures plan predicts memory with and Stage's own
// counters are held to (test_planner_model.cpp). All on one rank of the tensor group: its widths,
// the largest vocabulary part, and with sequence parallelism its tp-th of the token rows where it
// keeps only those.
#pragma once
#include <cstddef>
#include <vector>

#include "pipetrain/config/spec.hpp"
#include "pipetrain/model/layer_decl.hpp"
#include "pipetrain/model/partition.hpp"

namespace pipetrain {

// Bytes one micro-batch keeps between its forward and its backward on a stage of `blocks`:
// none: every declared activation of its blocks (and the head's on the last stage) and each
// block's input (b x heads x T attention row statistics among them: no T x T matrix); block: each
// block's input (+ the head's); stage: the received input only. Plus tokens (first stage) and
// targets (last), 4 B each.
size_t stash_bytes_per_micro_batch(const RunSpec& spec, int stage, int n_stages, BlockSpan blocks, Recompute mode);

// Bytes a split backward keeps from a micro-batch's input half (B) to its weight half (W): every
// layer's declared output gradients (11 C per token for a gpt2 block on one rank; the head's V per
// token + C per kept row, the embedding's C per kept row).
size_t wgrad_bytes_per_micro_batch(const RunSpec& spec, int stage, int n_stages, BlockSpan blocks);

// What a Stage itself allocates for its passes: the declared scratch, a fused backward's output
// gradients, a split vocabulary's sums and under recompute the work area (Stage::scratch_bytes).
size_t stage_scratch_bytes(const RunSpec& spec, const std::vector<ChunkRange>& chunks, int n_virtual);

// Bytes a rank uses besides parameters, gradients, AdamW state and stashed activations: the
// Stage's own (stage_scratch_bytes: under recompute one micro-batch's activations of its largest
// chunk among them), the kernels' own scratch and the executor's send/receive rings. Its chunks
// share all of these.
size_t working_bytes(const RunSpec& spec, const std::vector<ChunkRange>& chunks, int n_virtual);

// Which buffer pool each of a rank's chunks draws its micro-batches' buffers from: chunks of one
// shape (blocks, first, last) share one, so a released slot is only ever reused at its own size.
// Pools are numbered from 0 in the order of their first chunk.
std::vector<int> buffer_pools(const std::vector<ChunkRange>& chunks, int n_virtual);

}  // namespace pipetrain
