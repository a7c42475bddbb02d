#include "pipetrain/compute/parallel_for.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace pipetrain {
namespace {

// One call's work. Each call gets a fresh Job, so a worker that wakes late only finds a job whose
// chunks are all taken: it can never run a chunk of a later call with an earlier body.
struct Job {
  const std::function<void(size_t, size_t)>* body;
  size_t n, grain, chunks;
  std::atomic<size_t> next{0}, done{0};

  void run_chunks() {
    for (size_t c; (c = next.fetch_add(1)) < chunks;) {
      (*body)(c * grain, std::min(n, (c + 1) * grain));
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

// Workers sleep on a condition variable between calls: a spinning worker would take the core
// from the BLAS threads (or, oversubscribed, from another rank).
class Pool {
 public:
  ~Pool() { resize(1); }

  void resize(int threads) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
    stop_ = false;
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  void run(const std::shared_ptr<Job>& job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = job;
      ++generation_;
    }
    wake_.notify_all();
    job->run_chunks();  // the caller works too
    while (job->done.load(std::memory_order_acquire) < job->chunks) std::this_thread::yield();
    std::lock_guard<std::mutex> lock(mu_);
    job_.reset();
  }

 private:
  void work() {
    uint64_t seen = 0;
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      if (job) job->run_chunks();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::shared_ptr<Job> job_;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

Pool& pool() {
  static Pool p;
  return p;
}

}  // namespace

void set_parallel_threads(int threads) {
  if (threads != pool().threads()) pool().resize(std::max(1, threads));
}

void parallel_for(size_t n, size_t grain, const std::function<void(size_t, size_t)>& body) {
  grain = std::max<size_t>(grain, 1);
  const size_t chunks = chunk_count(n, grain);
  if (chunks <= 1 || pool().threads() == 1) {
    for (size_t c = 0; c < chunks; ++c) body(c * grain, std::min(n, (c + 1) * grain));
    return;
  }
  auto job = std::make_shared<Job>();
  job->body = &body;
  job->n = n;
  job->grain = grain;
  job->chunks = chunks;
  pool().run(job);
}

}  // namespace pipetrain
