#include "pipetrain/model/expert_parallel.hpp"

#include <algorithm>

#include "pipetrain/compute/profile.hpp"

namespace pipetrain {

void ExpertDispatch::plan(const MoeRouting& r, int held, ExpertGroup& group) {
  const int ranks = ep_.size;
  // Rows of each expert this rank sends: rank j's experts are the routing's [j held, (j + 1) held).
  counts_.assign(2 * static_cast<size_t>(ranks) * held, 0);
  int* sent = counts_.data();
  int* from = counts_.data() + static_cast<size_t>(ranks) * held;
  for (int e = 0; e < ranks * held; ++e) sent[e] = r.offsets[e + 1] - r.offsets[e];
  group.all_to_all(sent, from, held);  // from[i held + e]: rows rank i sends for this rank's expert e
  send_rows_.assign(ranks, 0);
  recv_rows_.assign(ranks, 0);
  offsets_.assign(held + 1, 0);
  for (int i = 0; i < ranks; ++i)
    for (int e = 0; e < held; ++e) {
      send_rows_[i] += sent[i * held + e];
      recv_rows_[i] += from[i * held + e];
      offsets_[e + 1] += from[i * held + e];
    }
  for (int e = 0; e < held; ++e) offsets_[e + 1] += offsets_[e];
  // Arrived source after source (each its experts in order); run expert after expert.
  blocks_.clear();
  std::vector<int> next(offsets_.begin(), offsets_.end() - 1);
  int arrived = 0;
  for (int i = 0; i < ranks; ++i)
    for (int e = 0; e < held; ++e) {
      const int n = from[i * held + e];
      blocks_.push_back({arrived, next[e], n});
      arrived += n;
      next[e] += n;
    }
}

void ExpertDispatch::reorder(const float* from, float* to, int width, bool to_experts) const {
  for (const Block& b : blocks_) {
    const size_t src = to_experts ? b.arrived : b.runs, dst = to_experts ? b.runs : b.arrived;
    copy_values(to + dst * width, from + src * width, static_cast<size_t>(b.count) * width);
  }
}

void ExpertDispatch::float_counts(int width, bool back) {
  const std::vector<int>&out_rows = back ? recv_rows_ : send_rows_, &in_rows = back ? send_rows_ : recv_rows_;
  float_counts_send_.resize(ep_.size);
  float_counts_recv_.resize(ep_.size);
  for (int j = 0; j < ep_.size; ++j) {
    float_counts_send_[j] = out_rows[j] * width;
    float_counts_recv_[j] = in_rows[j] * width;
  }
}

void ExpertDispatch::send(const float* rows, Floats& out, int width, ExpertGroup& group, Floats& staging) {
  float_counts(width, false);
  const size_t n = static_cast<size_t>(this->rows()) * width;
  ensure_size(staging, n);
  group.all_to_all(rows, float_counts_send_, staging.data(), float_counts_recv_);
  KernelTimer timer(Kernel::routing);
  ensure_size(out, n);
  reorder(staging.data(), out.data(), width, true);
}

void ExpertDispatch::bring_back(const float* rows, Floats& out, int width, ExpertGroup& group, Floats& staging) {
  float_counts(width, true);  // what came from rank j goes back to it
  size_t back = 0;
  for (int n : float_counts_recv_) back += n;
  ensure_size(staging, static_cast<size_t>(this->rows()) * width);
  {
    KernelTimer timer(Kernel::routing);
    reorder(rows, staging.data(), width, false);
  }
  ensure_size(out, back);
  group.all_to_all(staging.data(), float_counts_send_, out.data(), float_counts_recv_);
}

}  // namespace pipetrain
