// Which part of a stage's parameters a data-parallel rank keeps optimizer state for and updates,
// and what else it keeps of them only for that part. Without sharding (parallel.zero = 0) it keeps
// everything. Sharded, rank r of D owns the same row slab of every tensor, rows
// [r*n0/D, (r+1)*n0/D) of its first dimension: exactly the slab it writes into a checkpoint shard,
// so a sharded run saves what it owns and the files do not depend on the mode. A slab is
// contiguous in the stage's flat buffer, and the slabs of a tensor follow each other in rank
// order, which a reduce-scatter and an all-gather over that tensor's range need. The level says
// what is kept for the slab alone, in compact buffers (slab after slab, at state_offset): from 1
// AdamW's moments, from 2 the summed gradient, at 3 the weights too.
#pragma once
#include <cstddef>
#include <vector>

#include "pipetrain/model/model.hpp"

namespace pipetrain {

// Rows [begin, end) of `rows` that rank `rank` of `size` owns.
struct RowRange {
  size_t begin, end;
};
RowRange row_slab(size_t rows, int rank, int size);

// Elements of one row of a tensor (the product of its dimensions after the first).
size_t row_elements(const ParamTensor& p);

class OptimizerShard {
 public:
  // One tensor's owned slab: elements [begin, end) of the flat buffer, kept at state_offset in the
  // optimizer's own (compact) moment buffers.
  struct Slab {
    size_t tensor;  // index in the stage's params()
    size_t begin, end, state_offset;
    size_t size() const { return end - begin; }
  };
  OptimizerShard() = default;
  // Rank `rank` of `size` replicas at parallel.zero = `level` (1 when sharded and not said); size 1
  // owns everything, whatever the level. Under expert parallelism (`ep` consecutive replicas split
  // the experts) an expert tensor is sharded over the size / ep replicas holding the same experts,
  // this one being rank / ep of them.
  OptimizerShard(const std::vector<ParamTensor>& params, int rank, int size, int level = 1, int ep = 1);

  int rank() const { return rank_; }
  int size() const { return size_; }
  // This rank's place among the replicas that shard tensor p: the data group's, or an expert
  // tensor's replicas.
  TpPart part_of(const ParamTensor& p) const {
    return p.expert ? TpPart{rank_ / ep_, size_ / ep_} : TpPart{rank_, size_};
  }
  bool sharded() const { return size_ > 1; }
  bool shards_grads() const { return sharded() && level_ >= 2; }    // ZeRO-2 and 3
  bool shards_weights() const { return sharded() && level_ >= 3; }  // ZeRO-3
  const std::vector<Slab>& slabs() const { return slabs_; }         // one per tensor, in params() order
  size_t state_floats() const { return state_floats_; }             // floats of each AdamW moment held
  // Every rank's slab of tensor p, as element counts and offsets within the tensor (for the
  // reduce-scatter and all-gather over it).
  void rank_parts(const ParamTensor& p, std::vector<int>& counts, std::vector<int>& offsets) const;
  // The largest state_floats() of any rank of `size` (plan and the memory check size for it).
  static size_t max_state_floats(const std::vector<ParamTensor>& params, int size, int ep = 1);
  // The gradient floats whose reduce-scatters may travel at once (GradReducer waits for the oldest
  // beyond it): two buckets of `bucket_floats` or two of the largest tensor, whichever is more, so
  // that the next is always queued behind the one on the link. MPI keeps a scratch copy of each
  // travelling reduce-scatter's part: bounding them bounds it (plan's reduce_scratch_bytes).
  static size_t reduce_window(const std::vector<ParamTensor>& params, size_t bucket_floats);

 private:
  int rank_ = 0, size_ = 1, level_ = 0, ep_ = 1;
  std::vector<Slab> slabs_;
  size_t state_floats_ = 0;
};

// Where a replica's values of each slab lie: in a stage's flat buffer (at the slab's begin) or in
// a compact buffer of its slabs alone (at its state_offset).
struct SlabView {
  float* base;
  bool compact;
  float* at(const OptimizerShard::Slab& s) const { return base + (compact ? s.state_offset : s.begin); }
};

}  // namespace pipetrain
