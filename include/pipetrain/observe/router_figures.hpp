// What the routers of a mixture of experts did over one logged step, per MoE block: each expert's
// share of the token slots routed (a token's top_k choices), how far the busiest expert is above
// the mean, the slots a capacity dropped, and the router's losses. Every rank packs its own MoE
// blocks' counts into one array laid out for the whole model (pack_router_counts: a rank leaves
// other blocks' parts 0, and a tensor group's other ranks, which route alike, send zeros), so that
// rank 0 sums the gathered arrays and reads each block once, whichever layout ran it.
#pragma once
#include <cstddef>
#include <nlohmann/json.hpp>
#include <vector>

namespace pipetrain {

// One block's counts over the step, as a rank packs them.
struct RouterCounts {
  std::vector<double> chosen;  // slots choosing each expert
  double dropped = 0, aux_loss_sum = 0, z_loss_sum = 0, micro_batches = 0;
};
struct RouterFigures {
  int block = 0;
  std::vector<double> share;        // each expert's share of the slots (sums to 1)
  double load_max = 0;              // the largest share over the mean share (1: balanced)
  double dropped = 0;               // share of the slots a capacity dropped
  double aux_loss = 0, z_loss = 0;  // means over the step's micro-batches
};

// The doubles one rank packs for a model whose MoE blocks are `moe_blocks` (global indices).
size_t router_fields(size_t moe_blocks, int experts);
// Packs `counts` (a global block index and its counts) into `out` (router_fields long, zeroed).
void pack_router_counts(const std::vector<int>& moe_blocks, int experts, int block, const RouterCounts& counts,
                        double* out);
// Rank 0: the figures of every MoE block from all ranks' packed arrays (one after another).
std::vector<RouterFigures> combine_router_counts(const std::vector<int>& moe_blocks, int experts,
                                                 const std::vector<double>& all_ranks);
// metrics.jsonl's keys for them (docs/design.md, "metrics.jsonl"), added to `j`.
void add_router_keys(nlohmann::ordered_json& j, const std::vector<RouterFigures>& layers);

}  // namespace pipetrain
