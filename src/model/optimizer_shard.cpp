#include "pipetrain/model/optimizer_shard.hpp"

#include <algorithm>

namespace pipetrain {

RowRange row_slab(size_t rows, int rank, int size) {
  const PartRows p = part_rows(static_cast<int64_t>(rows), TpPart{rank, size});  // the same cut as a tensor rank's
  return {static_cast<size_t>(p.begin), static_cast<size_t>(p.end)};
}

size_t row_elements(const ParamTensor& p) {
  size_t row = 1;
  for (size_t d = 1; d < p.shape.size(); ++d) row *= static_cast<size_t>(p.shape[d]);
  return row;
}

OptimizerShard::OptimizerShard(const std::vector<ParamTensor>& params, int rank, int size, int level, int ep)
    : rank_(rank), size_(size), level_(size > 1 ? level : 0), ep_(size > 1 ? ep : 1) {
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamTensor& p = params[i];
    const TpPart part = part_of(p);
    const RowRange r = row_slab(static_cast<size_t>(p.shape[0]), part.rank, part.size);
    const size_t row = row_elements(p);
    slabs_.push_back({i, p.offset + r.begin * row, p.offset + r.end * row, state_floats_});
    state_floats_ += (r.end - r.begin) * row;
  }
}

void OptimizerShard::rank_parts(const ParamTensor& p, std::vector<int>& counts, std::vector<int>& offsets) const {
  const int size = part_of(p).size;
  counts.resize(size);
  offsets.resize(size);
  const size_t row = row_elements(p);
  for (int r = 0; r < size; ++r) {
    const RowRange rr = row_slab(static_cast<size_t>(p.shape[0]), r, size);
    counts[r] = static_cast<int>((rr.end - rr.begin) * row);
    offsets[r] = static_cast<int>(rr.begin * row);
  }
}

size_t OptimizerShard::max_state_floats(const std::vector<ParamTensor>& params, int size, int ep) {
  size_t most = 0;
  for (int r = 0; r < size; ++r) most = std::max(most, OptimizerShard(params, r, size, 1, ep).state_floats());
  return most;
}

size_t OptimizerShard::reduce_window(const std::vector<ParamTensor>& params, size_t bucket_floats) {
  size_t largest = 0;
  for (const ParamTensor& p : params) largest = std::max(largest, p.size);
  return 2 * std::max(bucket_floats, largest);
}

}  // namespace pipetrain
