// Which blocks each pipeline stage owns. The model is cut into pp x V contiguous chunks, one per
// virtual stage (V = parallel.virtual_stages, 1 unless the schedule is chunked); the schedule's
// placement (schedule/placement.hpp) says which rank owns which. The first virtual stage also holds
// the embeddings and the last the final LayerNorm, LM head and loss, which the cost model counts.
#pragma once
#include <string>
#include <vector>

#include "pipetrain/config/spec.hpp"
#include "pipetrain/schedule/placement.hpp"

namespace pipetrain {

// Forward + backward FLOPs per token of one block, of the embedding and of the head, all that
// layer_decl.hpp declares (the balanced partition weighs stages by them).
struct CostModel {
  double block, embed, head;
  static CostModel of(const RunSpec& spec);
};

// Model FLOPs of one training token (forward + backward of every matrix product and attention, as
// layer_decl.hpp declares them; recompute not counted): the numerator of MFU.
double training_flops_per_token(const RunSpec& spec);

// Blocks per virtual stage (size pp x V, each >= 1, sum n_layer) for parallel.partition.
std::vector<int> partition_blocks(const RunSpec& spec);

// The contiguous split whose slowest (virtual) stage is fastest: each stage's cost-model FLOPs
// times its `seconds_per_flop` (one per virtual stage; empty: all alike, parallel.partition =
// "balanced"). With measured rates it gives a slower rank fewer blocks (log.straggler_action =
// "rebalance").
std::vector<int> balanced_blocks(const RunSpec& spec, const std::vector<double>& seconds_per_flop = {});

// The chunks a rank owns, in chunk order: virtual stage, blocks [block_begin, block_end).
struct ChunkRange {
  int vstage, block_begin, block_end;
};
std::vector<ChunkRange> chunks_of(const std::vector<int>& blocks, const ChunkPlacement& placement, int stage);

// Estimated cost of each (virtual) stage of a partition.
std::vector<double> stage_costs(const RunSpec& spec, const std::vector<int>& blocks);

// One line per (virtual) stage: blocks, parameter count, estimated cost share.
std::string describe_partition(const RunSpec& spec, const std::vector<int>& blocks);

}  // namespace pipetrain
