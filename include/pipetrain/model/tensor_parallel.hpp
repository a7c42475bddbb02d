// Tensor parallelism in the model: which part of each whole tensor a tensor rank holds, and the
// collectives its layers need across the tensor group (parallel.tp ranks of one stage and replica).
//
// The split is Megatron's. The q/k/v product and the MLP's first product are split by output rows
// (a rank keeps its heads, its share of the hidden width: column-parallel in Megatron's words), the
// attention's and the MLP's output products by input columns (row-parallel), whose partial outputs
// the group sums. The vocabulary is split by rows of wte and of the LM head: the embedding's lookup
// and the loss's softmax statistics are summed (and maxed) over the group, so no rank ever holds
// the full logits. Norms, position embeddings and the output products' biases are whole on every
// rank; their gradients come out the same on each (their inputs are), so nothing sums them.
//
// Fewer key/value heads than tensor ranks (multi-query attention, or 4 heads at tp 8): tp / n_kv
// consecutive ranks hold the same key/value head, the one their query heads attend with. Each
// computes that head's gradient from its own query heads only, so the ranks holding it sum their
// shares at the step's end (TpSlice::replica); the grad norm counts the head once.
//
// Sequence parallelism (parallel.sequence_parallel) splits, outside the matrix products, a
// micro-batch's token rows too: rank r keeps rows [r N/tp, (r+1) N/tp) of the residual stream, the
// norms and their outputs, and sends only those to the next stage. The input of a split product is
// all-gathered first (and again in the backward, rather than kept whole); the partial outputs of a
// row-parallel product are reduce-scattered instead of all-reduced, and so are the input gradients
// of the split products. The norms' weight gradients are then each rank's rows' share, which the
// group sums at the step's end (ParamTensor::sums_over_tokens).
//
// A checkpoint, an exported model and train.init_from hold whole tensors: a rank writes and reads
// its part of each (whole_runs), so any tp resumes from any other. Expert parallelism's parts (a
// rank's experts, TpSlice::row_offset) are placed the same way.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace pipetrain {

// This rank's place in its tensor group.
struct TpPart {
  int rank = 0, size = 1;
};

// Part `rank` of `size` of n consecutive rows: [begin, end), as evenly as they go (the vocabulary
// need not divide); ZeRO-1's row slabs (row_slab) are cut the same way.
struct PartRows {
  int64_t begin, end;
  int64_t size() const { return end - begin; }
};
inline PartRows part_rows(int64_t n, const TpPart& p) { return {n * p.rank / p.size, n * (p.rank + 1) / p.size}; }

// Which of `heads` heads a tensor rank holds, as a part of them: its tp-th when tp divides them;
// with fewer heads than ranks (tp a multiple of them), the one head its query heads use.
inline TpPart heads_part(int heads, const TpPart& tp) {
  return heads >= tp.size ? tp : TpPart{tp.rank * heads / tp.size, heads};
}
// Which of the ranks holding the same part of `heads` this rank is: {0, 1} unless heads are fewer
// than the ranks.
inline TpPart heads_replica(int heads, const TpPart& tp) {
  return heads >= tp.size ? TpPart{} : TpPart{tp.rank % (tp.size / heads), tp.size / heads};
}

// How one of a rank's tensors sits in the whole tensor.
struct TpSlice {
  std::vector<int> whole;   // the whole tensor's shape (the rank's own when nothing is split)
  int axis = -1;            // the dimension the group splits; -1: every rank holds it whole
  std::vector<int> groups;  // that dimension as consecutive groups (q, k, v), each split alike
  TpPart part;              // the rank's part of each group (its tensor rank, or its key/value head)
  TpPart replica;           // which of the ranks holding the same elements this is (whole: all of them)
  // Whole rows before the part's first (split or not): an expert-parallel rank's experts lie after
  // the earlier ranks' (the rows it holds are then a block of the whole, each split as above).
  size_t row_offset = 0;
  // The rank whose copy the grad norm counts.
  bool counted() const { return replica.rank == 0; }
  // Split, yet held by several ranks (a key/value head): each has a share of its gradient to sum.
  bool shared() const { return axis >= 0 && replica.size > 1; }
  size_t whole_size() const {
    size_t n = 1;
    for (int d : whole) n *= static_cast<size_t>(d);
    return n;
  }
};

// A run of consecutive elements of a rank's tensor and where it lies in the whole tensor.
struct ElementRun {
  size_t whole, local, count;
};
// Elements [begin, end) of a rank's tensor of `shape` (1-D or 2-D, counted from its start), as runs
// in the whole tensor, in order.
std::vector<ElementRun> whole_runs(const TpSlice& slice, const std::vector<int>& shape, size_t begin, size_t end);
// Copies the rank's part of `whole` into `part` (the whole tensor of slice.whole; part of `shape`).
void take_part(const TpSlice& slice, const std::vector<int>& shape, const float* whole, float* part);

// In-place collectives over the tensor group, on the compute device's memory, every member calling
// them in the same order (dist implements them; train hands them to the Stage).
class TensorGroup {
 public:
  virtual ~TensorGroup() = default;
  virtual void sum(float* buf, size_t n) = 0;
  virtual void sum(double* buf, size_t n) = 0;
  virtual void max(float* buf, size_t n) = 0;
  // Sequence parallelism: every rank's `n` values into `whole` in rank order; the group's sum of
  // `whole` (size x n), this rank keeping its part in `part`.
  virtual void all_gather(const float* part, float* whole, size_t n) = 0;
  virtual void reduce_scatter(const float* whole, float* part, size_t n) = 0;
};

}  // namespace pipetrain
