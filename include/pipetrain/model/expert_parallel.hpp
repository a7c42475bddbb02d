// Expert parallelism in the model (parallel.ep): an MoE block's experts spread over the ep ranks
// of an expert group (consecutive data-parallel replicas of one stage and tensor rank), each
// holding experts / ep of them, all on one rank. Every rank routes its own tokens over all the
// experts (the router is whole on each); the rows its routing lays out expert after expert are
// then contiguous per destination (rank j holds experts [j E/ep, (j + 1) E/ep)), so one
// all-to-all sends each rank the rows of its experts, which it reorders expert after expert (each
// expert's rows source after source, each source's in its token order) to run them as grouped
// products, and a second all-to-all brings the outputs back in the routing's own order. The
// backward sends the output gradients the same way and brings the input gradients back.
//
// The rows a rank receives depend on the routing: its buffers grow to what arrives (the planner
// declares the balanced N top_k rows per micro-batch; a busier expert rank holds more).
#pragma once
#include <vector>

#include "pipetrain/compute/array.hpp"
#include "pipetrain/compute/moe_kernels.hpp"
#include "pipetrain/model/tensor_parallel.hpp"

namespace pipetrain {

using Floats = Array<float>;  // on the rank's compute device

// The expert group's all-to-alls, every member calling them in the same order (dist implements
// them; train hands them to the Stage). The rows are on the compute device.
class ExpertGroup {
 public:
  virtual ~ExpertGroup() = default;
  // `n` ints to each rank (send[j n ...] to rank j), n from each into recv, in rank order.
  virtual void all_to_all(const int* send, int* recv, int n) = 0;
  // send_counts[j] floats to rank j, consecutive in send in rank order; recv_counts[i] from rank i
  // into recv, in rank order.
  virtual void all_to_all(const float* send, const std::vector<int>& send_counts, float* recv,
                          const std::vector<int>& recv_counts) = 0;
};

// Where one routing's rows go and come back from, on rank `ep` of its expert group.
class ExpertDispatch {
 public:
  explicit ExpertDispatch(TpPart ep) : ep_(ep) {}
  // Learns, from every rank of the group, how many rows of each of this rank's `held` experts it
  // sends (an all-to-all of counts).
  void plan(const MoeRouting& r, int held, ExpertGroup& group);
  int rows() const { return offsets_.back(); }            // the rows this rank's experts run
  const int* offsets() const { return offsets_.data(); }  // [held + 1]: expert e's among them
  // The routing's rows [r.rows(), width] to the ranks of their experts: this rank's experts' rows
  // into `out` [rows(), width], expert after expert. `rows` may lie in `out`; they travel through
  // `staging`.
  void send(const float* rows, Floats& out, int width, ExpertGroup& group, Floats& staging);
  // This rank's experts' rows [rows(), width] back to their tokens' ranks, into `out`
  // [r.rows(), width] in the routing's order. `rows` may lie in `out`.
  void bring_back(const float* rows, Floats& out, int width, ExpertGroup& group, Floats& staging);

 private:
  struct Block {  // one source's rows of one expert: where they arrive, where they run
    int arrived, runs, count;
  };
  void reorder(const float* from, float* to, int width, bool to_experts) const;
  // The floats of `width`-wide rows each rank sends and receives: to the experts, or `back`.
  void float_counts(int width, bool back);
  TpPart ep_;
  std::vector<int> send_rows_, recv_rows_;  // per rank
  std::vector<int> offsets_{0};
  std::vector<Block> blocks_;
  std::vector<int> counts_, float_counts_send_, float_counts_recv_;
};

// Grows `a` to at least n elements (a buffer sized by what arrives).
inline void ensure_size(Floats& a, size_t n) {
  if (a.size() < n) a.resize(n);
}

}  // namespace pipetrain
