// A stage's parameters: the named tensors of all of a rank's chunks, and their weights and
// gradients in one flat buffer each (one contiguous range per tensor, chunk after chunk), so that
// gradient buckets and checkpoint slabs are slices of one array. Names are global (h.{i} uses the
// global block index), and a tensor's initial values depend on its name alone, so any layout
// starts from the same model.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "pipetrain/compute/array.hpp"
#include "pipetrain/config/spec.hpp"
#include "pipetrain/model/block_tensors.hpp"
#include "pipetrain/model/partition.hpp"
#include "pipetrain/model/tensor_parallel.hpp"

namespace pipetrain {

struct ParamTensor {
  std::string name;
  std::vector<int> shape;  // this rank's part (the whole tensor unless tensor parallelism splits it)
  size_t offset = 0, size = 0;
  bool decay = false;      // AdamW weight decay applies (2-D weights only)
  bool tied_copy = false;  // the last stage's copy of a tied wte: not in the grad norm, not saved
  Init init = Init::normal;
  TpSlice tp;  // where the part lies in the whole tensor
  // Sequence parallelism: a norm's weight, whose gradient on a tensor rank is its token rows'
  // share, summed over the tensor group at the step's end.
  bool sums_over_tokens = false;
  // Expert parallelism: an MoE block's experts, of which this rank holds its expert group's part
  // (tp.row_offset places it); summed over the replicas holding the same experts, not the data group.
  bool expert = false;
  // The rank holds a part of the whole tensor: the tensor group splits it, or it is an expert
  // part (the whole's norm is the sum of the parts').
  bool split() const { return tp.axis >= 0 || expert; }
};

// The named tensors a stage owns, in buffer order with offsets (no allocation): embeddings on the
// first stage, blocks [block_begin, block_end), final LayerNorm and head on the last; tensor rank
// `tp`'s parts of them, and of the experts expert-parallel rank `ep`'s (the whole tensors by default).
std::vector<ParamTensor> stage_params(const RunSpec& spec, int stage, int n_stages, int block_begin, int block_end,
                                      TpPart tp = {}, TpPart ep = {});
// The tensors of all of a rank's chunks (virtual stages of n_virtual), chunk after chunk. A tied
// head on the rank that also holds the embedding (a vee's first rank) uses wte itself, no copy.
std::vector<ParamTensor> rank_params(const RunSpec& spec, const std::vector<ChunkRange>& chunks, int n_virtual,
                                     TpPart tp = {}, TpPart ep = {});

class ParamStore {
 public:
  ParamStore(std::vector<ParamTensor> params, int n_layer);
  const std::vector<ParamTensor>& params() const { return params_; }
  Array<float>& weights() { return weights_; }
  Array<float>& grads() { return grads_; }
  const ParamTensor* find(const std::string& name) const;
  // Where a tensor starts in the buffers; kAbsent where the family (or this stage) has none.
  static constexpr size_t kAbsent = static_cast<size_t>(-1);
  size_t offset_of(const std::string& name) const;
  void init(uint64_t seed);  // deterministic per name: same weights on any layout
  void zero_grads();
  // Zeroes the gradients and gives their memory back (device.hpp's release_values): under ZeRO-2
  // and 3 the whole buffer is present only while a step accumulates into it.
  void release_grads();
  // Frees the flat weight buffer (ZeRO-3: after start-up the optimizer keeps this replica's slabs
  // and the passes read gathered layers from LayerGather's slots); weights() is then empty.
  void drop_weights() { weights_ = Array<float>(); }

 private:
  std::vector<ParamTensor> params_;
  int n_layer_;  // the residual projections' initial spread scales with it
  Array<float> weights_, grads_;
};

}  // namespace pipetrain
