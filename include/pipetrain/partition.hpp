// Which blocks each pipeline stage owns. Stages own contiguous ranges; the first stage also holds
// the embeddings and the last the final LayerNorm, LM head and loss, which the cost model counts.
#pragma once
#include <string>
#include <vector>

#include "pipetrain/config.hpp"

namespace pipetrain {

// Estimated forward+backward FLOPs per token of one block, of the embedding and of the head.
struct CostModel {
  double block, embed, head;
  static CostModel of(const RunSpec& spec);
};

// Model FLOPs of one training token (forward + backward of every matrix product as our kernels
// run them, recompute not counted): the numerator of MFU.
double training_flops_per_token(const RunSpec& spec);

// Blocks per stage (size pp, each >= 1, sum n_layer) for parallel.partition.
std::vector<int> partition_blocks(const RunSpec& spec);

// Estimated cost of each stage of a partition.
std::vector<double> stage_costs(const RunSpec& spec, const std::vector<int>& blocks);

// One line per stage: blocks, parameter count, estimated cost share.
std::string describe_partition(const RunSpec& spec, const std::vector<int>& blocks);

}  // namespace pipetrain
