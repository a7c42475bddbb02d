// A tensor group whose ranks are threads of one process: the collectives a Stage's layers call
// (model/tensor_parallel.hpp), done in shared memory; and likewise an expert group's all-to-alls
// (model/expert_parallel.hpp). Each rank posts its buffer, all wait at a
// barrier, each computes its own result from every rank's buffer in rank order (so all ranks get
// the same bits), and all wait again before any buffer may change. Lets a unit test run a real
// tensor-parallel Stage per thread without MPI.
#pragma once
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "pipetrain/model/expert_parallel.hpp"
#include "pipetrain/model/tensor_parallel.hpp"

namespace pipetrain::testing {

class ThreadGroupState {
 public:
  explicit ThreadGroupState(int size) : size_(size), posted_(size) {}
  int size() const { return size_; }
  void barrier() {
    std::unique_lock<std::mutex> lock(mutex_);
    const long gen = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else if (!cv_.wait_for(lock, std::chrono::seconds(60), [&] { return generation_ != gen; })) {
      throw std::runtime_error("a thread tensor group's rank did not reach a collective in 60 s");
    }
  }
  // Every rank's buffer of this collective, once all have posted.
  template <class T>
  std::vector<const T*> exchange(int rank, const T* mine) {
    posted_[rank] = mine;
    barrier();
    std::vector<const T*> all;
    for (const void* p : posted_) all.push_back(static_cast<const T*>(p));
    return all;
  }

 private:
  int size_;
  std::vector<const void*> posted_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  long generation_ = 0;
};

class ThreadTensorGroup : public TensorGroup {
 public:
  ThreadTensorGroup(ThreadGroupState& state, int rank) : state_(state), rank_(rank) {}
  void sum(float* buf, size_t n) override {
    reduce(buf, n, [](float a, float b) { return a + b; });
  }
  void sum(double* buf, size_t n) override {
    reduce(buf, n, [](double a, double b) { return a + b; });
  }
  void max(float* buf, size_t n) override {
    reduce(buf, n, [](float a, float b) { return a > b ? a : b; });
  }
  void all_gather(const float* part, float* whole, size_t n) override {
    const auto all = state_.exchange(rank_, part);
    for (size_t r = 0; r < all.size(); ++r) std::copy(all[r], all[r] + n, whole + r * n);
    state_.barrier();
  }
  void reduce_scatter(const float* whole, float* part, size_t n) override {
    const auto all = state_.exchange(rank_, whole);
    for (size_t i = 0; i < n; ++i) {
      float s = 0;
      for (const float* w : all) s += w[rank_ * n + i];
      part[i] = s;
    }
    state_.barrier();
  }

 private:
  template <class T, class Op>
  void reduce(T* buf, size_t n, Op op) {
    const auto all = state_.exchange(rank_, static_cast<const T*>(buf));
    std::vector<T> out(all[0], all[0] + n);
    for (size_t r = 1; r < all.size(); ++r)
      for (size_t i = 0; i < n; ++i) out[i] = op(out[i], all[r][i]);
    state_.barrier();  // every rank has read every buffer
    std::copy(out.begin(), out.end(), buf);
  }
  ThreadGroupState& state_;
  int rank_;
};

class ThreadExpertGroup : public ExpertGroup {
 public:
  ThreadExpertGroup(ThreadGroupState& state, int rank) : state_(state), rank_(rank) {}
  void all_to_all(const int* send, int* recv, int n) override {
    const auto all = state_.exchange(rank_, send);
    for (size_t i = 0; i < all.size(); ++i) std::copy_n(all[i] + rank_ * n, n, recv + i * n);
    state_.barrier();
  }
  void all_to_all(const float* send, const std::vector<int>& send_counts, float* recv,
                  const std::vector<int>& recv_counts) override {
    const Posted mine{send, &send_counts};
    const auto all = state_.exchange(rank_, &mine);
    size_t at = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      const std::vector<int>& counts = *all[i]->counts;  // what rank i sends each rank
      size_t from = 0;
      for (int j = 0; j < rank_; ++j) from += counts[j];
      if (counts[rank_] != recv_counts[i]) throw std::logic_error("an expert all-to-all's counts disagree");
      std::copy_n(all[i]->send + from, counts[rank_], recv + at);
      at += recv_counts[i];
    }
    state_.barrier();
  }

 private:
  struct Posted {
    const float* send;
    const std::vector<int>* counts;
  };
  ThreadGroupState& state_;
  int rank_;
};

// Runs f(rank, group) on `size` threads, one per rank of a group of `Group` (a thread tensor or
// expert group; the calling thread alone, without one, when size is 1), and rethrows the first
// failure.
template <class Group, class Interface>
void run_ranks(int size, const std::function<void(int rank, Interface* group)>& f) {
  if (size == 1) return f(0, nullptr);
  ThreadGroupState state(size);
  std::vector<std::unique_ptr<Group>> groups;
  for (int r = 0; r < size; ++r) groups.push_back(std::make_unique<Group>(state, r));
  std::vector<std::exception_ptr> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        f(r, groups[r].get());
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}
inline void run_tensor_ranks(int size, const std::function<void(int rank, TensorGroup* group)>& f) {
  run_ranks<ThreadTensorGroup, TensorGroup>(size, f);
}
inline void run_expert_ranks(int size, const std::function<void(int rank, ExpertGroup* group)>& f) {
  run_ranks<ThreadExpertGroup, ExpertGroup>(size, f);
}

}  // namespace pipetrain::testing
