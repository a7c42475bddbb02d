// The buffers a stage keeps for the micro-batches in flight: one micro-batch's activations (Acts)
// from its forward to its backward, and a split backward's output gradients (WGrads) from its B to
// its W, sized from the layer declarations (layer_decl.hpp).
#pragma once
#include <cstddef>
#include <deque>
#include <vector>

#include "pipetrain/model/layer_decl.hpp"
#include "pipetrain/model/partition.hpp"

namespace pipetrain {

// What a split backward keeps of one micro-batch from B to W.
struct WGrads {
  std::vector<BlockWGrads> blocks;
  HeadWGrads head;
  size_t bytes() const;
  void release();  // drop contents, keep capacity
};
// One micro-batch's activations. xs[l] is block l's input; on the last stage xs[L] is the head input.
struct Acts {
  Array<int> tokens, targets;
  std::vector<Floats> xs;
  std::vector<BlockActs> blocks;
  HeadActs head;
  // Whether blocks and head hold a micro-batch's activations. release() leaves their sizes (and
  // stale values) as they are, so that the next forward, which overwrites every element, finds
  // them sized already instead of zeroing them all again; bytes() skips them in between.
  bool acts_live = false;
  size_t bytes() const;  // what is held right now, counted from the buffers themselves
  void release();        // drop contents, keep capacity (no allocator churn between steps)
};

// Buffers of the (chunk, micro-batch) pairs in flight, in slots reused once released (keeping
// their capacity), so the memory held grows to the schedule's peak in flight (M for GPipe,
// P - stage for 1F1B, P for zb-h1, which releases them at W), not to M. Each shape of chunk has
// its own pools (buffer_pools), activations and split-backward gradients separate ones, so no
// slot keeps a larger chunk's or a split backward's capacity while it holds something smaller;
// plan predicts what they hold (held_activation_bytes).
class ActivationPool {
 public:
  ActivationPool(const std::vector<ChunkRange>& chunks, int n_virtual, int micro_batches);
  Acts& stash(int chunk, int mb);     // its slot, taken from the free ones on first use
  WGrads& wgrads(int chunk, int mb);  // likewise, from B to W
  bool holds(int chunk, int mb) const { return slot_of_[key(chunk, mb)] >= 0; }
  void release(int chunk, int mb);  // both back to their pools
  size_t bytes(int chunk, int mb) const;

 private:
  template <class T>
  struct Pool {
    std::deque<T> slots;  // a deque: growing it never moves the slots in use
    std::vector<int> free;
  };
  template <class T>
  static T& take(std::vector<Pool<T>>& pools, int pool, int& slot);
  template <class T>
  static void give_back(std::vector<Pool<T>>& pools, int pool, int& slot);
  int key(int chunk, int mb) const { return chunk * M_ + mb; }
  int M_;
  std::vector<int> pool_of_;  // per chunk
  std::vector<Pool<Acts>> acts_pools_;
  std::vector<Pool<WGrads>> wgrad_pools_;
  std::vector<int> slot_of_, wslot_of_;  // per key(chunk, mb): its slot in its pool, or -1
};

}  // namespace pipetrain
