#include "pipetrain/planner/reduce_overlap.hpp"

#include <algorithm>

namespace pipetrain {

ReduceTiming overlap_reduction(const std::vector<FinishingChunk>& chunks, double compute_end,
                               const std::vector<double>& pieces, const std::function<double(double bytes)>& piece_s) {
  // When the first `floats` of the buffer (in finishing order) are final: gradients become final
  // at an even pace over each chunk's last backward.
  auto final_at = [&](double floats) {
    for (const FinishingChunk& c : chunks) {
      if (floats <= c.floats) return c.floats > 0 ? c.start + (c.end - c.start) * floats / c.floats : c.end;
      floats -= c.floats;
    }
    return chunks.empty() ? compute_end : chunks.back().end;
  };
  ReduceTiming r;
  double link_free = 0, posted = 0;
  for (double floats : pieces) {  // one at a time over the link, each once it is final
    posted += floats;
    const double s = piece_s(sizeof(float) * floats);
    link_free = std::max(link_free, final_at(posted)) + s;
    r.total_s += s;
  }
  r.exposed_s = std::max(0.0, link_free - compute_end);
  return r;
}

}  // namespace pipetrain
