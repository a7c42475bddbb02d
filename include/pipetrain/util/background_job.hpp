// One piece of work run on its own thread while the thread that started it goes on, polled by that
// thread. pipetrain uses it for the slow part of an asynchronous checkpoint (writing bytes and
// fsyncing them); the work must share nothing with the starting thread while it runs, and never
// calls MPI or HDF5 (the process asks MPI for MPI_THREAD_FUNNELED: only the main thread calls it;
// this HDF5 is not thread-safe).
#pragma once
#include <functional>
#include <future>
#include <string>

namespace pipetrain {

class BackgroundJob {
 public:
  BackgroundJob() = default;
  ~BackgroundJob();  // waits for the work: its thread may not outlive what it reads
  BackgroundJob(const BackgroundJob&) = delete;
  BackgroundJob& operator=(const BackgroundJob&) = delete;

  // Starts `work` (returns "" on success, else what failed; an exception counts as a failure).
  // Only when idle.
  void start(std::function<std::string()> work);
  bool idle() const { return !result_.valid(); }
  bool running() const;  // started and not finished
  // Waits for the work and returns its result; idle afterwards.
  std::string collect();

 private:
  std::future<std::string> result_;
};

}  // namespace pipetrain
