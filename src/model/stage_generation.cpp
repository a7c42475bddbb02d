// Generation's forward: new tokens of one sequence through the same block and head code as
// training, their attention over the keys and values of the tokens before them (a KV cache), so
// each new token costs one token's pass instead of the whole prefix's.
#include <stdexcept>
#include <vector>

#include "pipetrain/compute/kernels.hpp"
#include "pipetrain/model/model.hpp"

namespace pipetrain {

void Stage::forward_cached(const int* tokens, int n, KvCache& cache, float* probs) {
  const Chunk& c = chunks_.front();
  if (chunks() != 1 || !c.first || !c.last || tp_.size != 1 || compute_device() != Device::cpu)
    throw std::logic_error("forward_cached runs a whole model on the CPU");
  if (n < 1 || cache.pos + n > T_) throw std::logic_error("the KV cache holds model.seq_len positions");
  const size_t KV = shape_.kv;
  if (cache.k.empty()) {
    cache.k.resize(c.L);
    cache.v.resize(c.L);
    for (int l = 0; l < c.L; ++l) {
      cache.k[l].resize(static_cast<size_t>(T_) * KV);
      cache.v[l].resize(static_cast<size_t>(T_) * KV);
    }
  }
  // Each new token's document start (masking) and position, carried on from the cached ones.
  std::vector<int> start(n), pos(n);
  cache.document = find_documents(tokens, n, cache.pos, cache.document, mask_, start.data(), pos.data());
  const Tokens tok{1, n, &cache, mask_.on() ? start.data() : nullptr, pos.data()};
  Acts& a = generation_;
  size_acts(c, a, tok);
  k_.encoder_forward(a.xs[0].data(), tokens, weight(wte_), weight(wpe_), 1, n, C_, 0, V_, tok.pos);
  for (int l = 0; l < c.L; ++l) block_forward(c, l, a.xs[l].data(), a.blocks[l], a.xs[l + 1].data(), tok);
  const std::vector<int> targets(n, 0);  // the loss is not wanted, only the probabilities
  head_forward(a.xs[c.L].data(), a.head, targets.data(), tok);
  copy_values(probs, a.head.probs.data(), static_cast<size_t>(n) * V_);
  cache.pos += n;
}

}  // namespace pipetrain
