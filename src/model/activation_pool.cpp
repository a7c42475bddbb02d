#include "pipetrain/model/activation_pool.hpp"

#include <algorithm>

#include "pipetrain/model/stage_memory.hpp"

namespace pipetrain {

size_t Acts::bytes() const {
  size_t n = (tokens.size() + targets.size()) * sizeof(int);
  auto count = [&](const Floats& v) { n += v.size() * sizeof(float); };
  for (auto& x : xs) count(x);
  if (acts_live) {
    for (auto& b : blocks) for_each_declared(b, kBlockActs, count);
    for_each_declared(head, kHeadActs, count);
  }
  return n;
}

size_t WGrads::bytes() const {
  size_t n = 0;
  auto count = [&](const Floats& v) { n += v.size() * sizeof(float); };
  for (auto& w : blocks) for_each_declared(w, kBlockWGrads, count);
  for_each_declared(head, kHeadWGrads, count);
  return n;
}

void WGrads::release() {
  for (auto& w : blocks) for_each_declared(w, kBlockWGrads, [](Floats& v) { v.clear(); });
  for_each_declared(head, kHeadWGrads, [](Floats& v) { v.clear(); });
}

void Acts::release() {
  tokens.clear();
  targets.clear();
  for (auto& x : xs) x.clear();
  acts_live = false;
}

ActivationPool::ActivationPool(const std::vector<ChunkRange>& chunks, int n_virtual, int micro_batches)
    : M_(micro_batches), pool_of_(buffer_pools(chunks, n_virtual)) {
  slot_of_.assign(static_cast<size_t>(micro_batches) * chunks.size(), -1);
  wslot_of_ = slot_of_;
  const size_t n_pools = *std::max_element(pool_of_.begin(), pool_of_.end()) + 1;
  acts_pools_ = std::vector<Pool<Acts>>(n_pools);  // built in place: a pool's deque cannot move without throwing
  wgrad_pools_ = std::vector<Pool<WGrads>>(n_pools);
}

template <class T>
T& ActivationPool::take(std::vector<Pool<T>>& pools, int pool, int& slot) {
  Pool<T>& p = pools[pool];
  if (slot < 0) {
    if (p.free.empty()) {
      p.free.push_back(static_cast<int>(p.slots.size()));
      p.slots.emplace_back();
    }
    slot = p.free.back();
    p.free.pop_back();
  }
  return p.slots[slot];
}

template <class T>
void ActivationPool::give_back(std::vector<Pool<T>>& pools, int pool, int& slot) {
  if (slot < 0) return;
  pools[pool].slots[slot].release();
  pools[pool].free.push_back(slot);
  slot = -1;
}

Acts& ActivationPool::stash(int chunk, int mb) { return take(acts_pools_, pool_of_[chunk], slot_of_[key(chunk, mb)]); }

WGrads& ActivationPool::wgrads(int chunk, int mb) {
  return take(wgrad_pools_, pool_of_[chunk], wslot_of_[key(chunk, mb)]);
}

void ActivationPool::release(int chunk, int mb) {
  give_back(acts_pools_, pool_of_[chunk], slot_of_[key(chunk, mb)]);
  give_back(wgrad_pools_, pool_of_[chunk], wslot_of_[key(chunk, mb)]);
}

size_t ActivationPool::bytes(int chunk, int mb) const {
  const int pool = pool_of_[chunk], slot = slot_of_[key(chunk, mb)], wslot = wslot_of_[key(chunk, mb)];
  return (slot < 0 ? 0 : acts_pools_[pool].slots[slot].bytes()) +
         (wslot < 0 ? 0 : wgrad_pools_[pool].slots[wslot].bytes());
}

}  // namespace pipetrain
