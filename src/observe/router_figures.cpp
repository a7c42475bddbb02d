#include "pipetrain/observe/router_figures.hpp"

#include <algorithm>
#include <cmath>

namespace pipetrain {
namespace {
constexpr size_t kScalars = 4;  // dropped, the two losses' sums, micro-batches
}

size_t router_fields(size_t moe_blocks, int experts) { return moe_blocks * (experts + kScalars); }

void pack_router_counts(const std::vector<int>& moe_blocks, int experts, int block, const RouterCounts& counts,
                        double* out) {
  const size_t at = std::find(moe_blocks.begin(), moe_blocks.end(), block) - moe_blocks.begin();
  double* p = out + at * (experts + kScalars);
  for (int e = 0; e < experts && e < static_cast<int>(counts.chosen.size()); ++e) p[e] += counts.chosen[e];
  p[experts] += counts.dropped;
  p[experts + 1] += counts.aux_loss_sum;
  p[experts + 2] += counts.z_loss_sum;
  p[experts + 3] += counts.micro_batches;
}

std::vector<RouterFigures> combine_router_counts(const std::vector<int>& moe_blocks, int experts,
                                                 const std::vector<double>& all_ranks) {
  const size_t fields = router_fields(moe_blocks.size(), experts);
  std::vector<double> sum(fields, 0);
  for (size_t i = 0; i < all_ranks.size(); ++i) sum[i % fields] += all_ranks[i];
  std::vector<RouterFigures> out;
  for (size_t b = 0; b < moe_blocks.size(); ++b) {
    const double* p = sum.data() + b * (experts + kScalars);
    RouterFigures f;
    f.block = moe_blocks[b];
    double slots = 0;
    for (int e = 0; e < experts; ++e) slots += p[e];
    const double micro_batches = std::max(1.0, p[experts + 3]);
    for (int e = 0; e < experts; ++e) f.share.push_back(slots > 0 ? p[e] / slots : 0);
    f.load_max = slots > 0 ? *std::max_element(f.share.begin(), f.share.end()) * experts : 0;
    f.dropped = slots > 0 ? p[experts] / slots : 0;
    f.aux_loss = p[experts + 1] / micro_batches;
    f.z_loss = p[experts + 2] / micro_batches;
    out.push_back(std::move(f));
  }
  return out;
}

void add_router_keys(nlohmann::ordered_json& j, const std::vector<RouterFigures>& layers) {
  if (layers.empty()) return;
  auto round6 = [](double v) { return std::round(v * 1e6) / 1e6; };
  double aux = 0, z = 0;
  nlohmann::ordered_json blocks = nlohmann::ordered_json::array(), load = blocks, dropped = blocks, share = blocks;
  for (const RouterFigures& f : layers) {
    aux += f.aux_loss / layers.size();
    z += f.z_loss / layers.size();
    blocks.push_back(f.block);
    load.push_back(round6(f.load_max));
    dropped.push_back(round6(f.dropped));
    nlohmann::ordered_json s = nlohmann::ordered_json::array();
    for (double v : f.share) s.push_back(round6(v));
    share.push_back(s);
  }
  j["moe_aux_loss"] = aux;
  j["moe_z_loss"] = z;
  j["moe_blocks"] = blocks;
  j["moe_load_max"] = load;
  j["moe_dropped"] = dropped;
  j["moe_expert_share"] = share;
}

}  // namespace pipetrain
