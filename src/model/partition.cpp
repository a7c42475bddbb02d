#include "pipetrain/model/partition.hpp"

#include "pipetrain/model/layer_decl.hpp"
#include "pipetrain/model/model.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <sstream>

namespace pipetrain {

namespace {
// A token's training FLOPs through the model's blocks, dense and MoE blocks each at their own.
PassFlops all_blocks_flops(const RunSpec& spec) {
  const int T = spec.model.seq_len;
  const BlockKinds kinds = block_kinds(spec, {0, spec.model.n_layer});
  PassFlops sum;
  sum.add(layer_training_flops(Layer::block, whole_widths(spec), T), kinds.dense);
  sum.add(layer_training_flops(Layer::moe_block, whole_widths(spec, Layer::moe_block), T), kinds.moe);
  return sum;
}
}  // namespace

CostModel CostModel::of(const RunSpec& spec) {
  const LayerWidths whole = whole_widths(spec);
  const int T = spec.model.seq_len;
  // A block costs the mean of the model's blocks (with model.moe.every > 1 its MoE blocks cost more).
  return {all_blocks_flops(spec).total() / spec.model.n_layer, layer_training_flops(Layer::embedding, whole, T).total(),
          layer_training_flops(Layer::head, whole, T).total()};
}

double training_flops_per_token(const RunSpec& spec) {
  const LayerWidths whole = whole_widths(spec);
  return all_blocks_flops(spec).model() + layer_training_flops(Layer::head, whole, spec.model.seq_len).model();
}

std::vector<double> stage_costs(const RunSpec& spec, const std::vector<int>& blocks) {
  const CostModel m = CostModel::of(spec);
  std::vector<double> costs;
  for (size_t s = 0; s < blocks.size(); ++s) {
    double c = blocks[s] * m.block;
    if (s == 0) c += m.embed;
    if (s + 1 == blocks.size()) c += m.head;
    costs.push_back(c);
  }
  return costs;
}

namespace {

std::vector<int> uniform(int n_layer, int pp) {
  std::vector<int> b(pp, n_layer / pp);
  for (int s = 0; s < n_layer % pp; ++s) b[s] += 1;  // the remainder goes to the first stages
  return b;
}

}  // namespace

// Contiguous split minimising the most expensive stage (exact dynamic programme over split points;
// ties broken toward the uniform split so balanced == uniform when costs are even).
std::vector<int> balanced_blocks(const RunSpec& spec, const std::vector<double>& seconds_per_flop) {
  const int L = spec.model.n_layer, P = spec.parallel.pp * spec.parallel.virtual_stages;
  const CostModel m = CostModel::of(spec);
  auto cost = [&](int s, int begin, int end) {
    double c = (end - begin) * m.block;
    if (s == 0) c += m.embed;
    if (s == P - 1) c += m.head;
    return seconds_per_flop.empty() ? c : c * seconds_per_flop[s];
  };
  const double inf = std::numeric_limits<double>::infinity();
  // best[s][e]: minimal max-cost placing blocks [0, e) on stages [0, s]
  std::vector<std::vector<double>> best(P, std::vector<double>(L + 1, inf));
  std::vector<std::vector<int>> cut(P, std::vector<int>(L + 1, 0));
  for (int e = 1; e <= L; ++e) best[0][e] = cost(0, 0, e);
  for (int s = 1; s < P; ++s)
    for (int e = s + 1; e <= L; ++e)
      for (int b = s; b < e; ++b) {
        double v = std::max(best[s - 1][b], cost(s, b, e));
        if (v < best[s][e] * (1 - 1e-12)) {
          best[s][e] = v;
          cut[s][e] = b;
        }
      }
  std::vector<int> blocks(P);
  for (int s = P - 1, e = L; s >= 0; --s) {
    int b = s == 0 ? 0 : cut[s][e];
    blocks[s] = e - b;
    e = b;
  }
  return blocks;
}

std::vector<int> partition_blocks(const RunSpec& spec) {
  const auto& p = spec.parallel;
  if (p.partition == Partition::explicit_list) return p.blocks_per_stage;
  if (p.partition == Partition::balanced) return balanced_blocks(spec);
  return uniform(spec.model.n_layer, p.pp * p.virtual_stages);
}

std::vector<ChunkRange> chunks_of(const std::vector<int>& blocks, const ChunkPlacement& placement, int stage) {
  std::vector<int> begin(blocks.size() + 1, 0);
  for (size_t v = 0; v < blocks.size(); ++v) begin[v + 1] = begin[v] + blocks[v];
  std::vector<ChunkRange> chunks;
  for (int c = 0; c < placement.chunks; ++c) {
    const int v = placement.vstage(stage, c);
    chunks.push_back({v, begin[v], begin[v + 1]});
  }
  return chunks;
}

std::string describe_partition(const RunSpec& spec, const std::vector<int>& blocks) {
  const auto costs = stage_costs(spec, blocks);
  double total = 0;
  for (double c : costs) total += c;
  const int P = static_cast<int>(blocks.size()), pp = spec.parallel.pp;
  std::ostringstream os;
  int begin = 0;
  for (int s = 0; s < P; ++s) {
    size_t params = 0;  // counted from the stage's actual tensor list (tied copy included)
    for (auto& t : stage_params(spec, s, P, begin, begin + blocks[s])) params += t.size;
    std::string extra;
    if (s == 0) extra += " +embeddings";
    if (s + 1 == P) extra += " +head";
    char name[64];  // with chunks: which rank runs this virtual stage
    if (P == pp) std::snprintf(name, sizeof name, "stage %d", s);
    else std::snprintf(name, sizeof name, "stage %d chunk %d", spec.chunk_placement().stage_of(s), s / pp);
    char line[240];
    std::snprintf(line, sizeof line, "  %s: blocks %d-%d (%d)%s, %zu params, cost %.1f%%\n", name, begin,
                  begin + blocks[s] - 1, blocks[s], extra.c_str(), params, 100.0 * costs[s] / total);
    os << line;
    begin += blocks[s];
  }
  return os.str();
}

}  // namespace pipetrain
