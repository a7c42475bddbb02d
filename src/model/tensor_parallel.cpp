#include "pipetrain/model/tensor_parallel.hpp"

#include <algorithm>

namespace pipetrain {
namespace {

// The whole tensor's row of local row i when the rows are split: each group contributes its part,
// one group after another.
size_t whole_row(const TpSlice& s, size_t i) {
  size_t base = 0;
  for (int n : s.groups) {
    const PartRows p = part_rows(n, s.part);
    if (i < static_cast<size_t>(p.size())) return base + p.begin + i;
    i -= p.size();
    base += n;
  }
  return base + i;  // past the last group: not reached for a consistent slice
}

}  // namespace

std::vector<ElementRun> whole_runs(const TpSlice& s, const std::vector<int>& shape, size_t begin, size_t end) {
  std::vector<ElementRun> runs;
  auto add = [&](size_t whole, size_t local, size_t count) {
    if (count == 0) return;
    if (!runs.empty() && runs.back().whole + runs.back().count == whole &&
        runs.back().local + runs.back().count == local) {
      runs.back().count += count;
      return;
    }
    runs.push_back({whole, local, count});
  };
  const size_t rows = shape[0], row = shape.size() > 1 ? shape[1] : 1;
  const size_t whole_row_len = s.whole.size() > 1 ? s.whole[1] : 1;
  if (s.axis < 0) {
    add(s.row_offset * whole_row_len + begin, begin, end - begin);
    return runs;
  }
  const size_t col0 = s.axis == 1 ? part_rows(s.whole[1], s.part).begin : 0;
  for (size_t i = begin / row; i < rows && i * row < end; ++i) {
    const size_t c0 = i * row < begin ? begin - i * row : 0, c1 = std::min(row, end - i * row);
    const size_t wrow = s.row_offset + (s.axis == 0 ? whole_row(s, i) : i);
    add(wrow * whole_row_len + col0 + c0, i * row + c0, c1 - c0);
  }
  return runs;
}

void take_part(const TpSlice& slice, const std::vector<int>& shape, const float* whole, float* part) {
  size_t n = 1;
  for (int d : shape) n *= static_cast<size_t>(d);
  for (const ElementRun& r : whole_runs(slice, shape, 0, n)) std::copy_n(whole + r.whole, r.count, part + r.local);
}

}  // namespace pipetrain
