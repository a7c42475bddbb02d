// How much of a rank's data-parallel gradient reduction its backward hides, as GradReducer runs
// it: each chunk's gradients become final during that chunk's last backward (from its head end
// to its embedding end), the buffer is cut from its end into buckets, each bucket is posted as
// soon as it is final, and the buckets go over the replicas' link one after another. What is
// still in flight when the rank's last backward ends is exposed: the step waits for it.
#pragma once
#include <functional>
#include <vector>

namespace pipetrain {

// One chunk's last backward: when it runs and how many gradient floats it finishes.
struct FinishingChunk {
  double start, end, floats;
};

struct ReduceTiming {
  double total_s = 0;    // every bucket's reduction, end to end
  double exposed_s = 0;  // of it, after the rank's last backward
};

// `chunks` in the order their last backwards run; `compute_end`: the rank's last backward's end;
// `pieces`: the floats of each collective in the order they are posted (buckets cut from the
// buffer's end, or under ZeRO-1 its tensors from the last); `piece_s`: seconds to reduce a piece
// of so many bytes.
ReduceTiming overlap_reduction(const std::vector<FinishingChunk>& chunks, double compute_end,
                               const std::vector<double>& pieces, const std::function<double(double bytes)>& piece_s);

}  // namespace pipetrain
