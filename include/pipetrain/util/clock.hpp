// Clocks: monotonic seconds for step, wait and save timings; wall-clock (Unix) seconds and ISO
// 8601 UTC for what a run records about when things happened.
#pragma once
#include <algorithm>
#include <chrono>
#include <ctime>
#include <string>

namespace pipetrain {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU time of the calling thread: what it computed, leaving out the time it waited for a core.
inline double thread_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

inline double wall_clock_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// When this process started (exec), in wall-clock seconds: from the kernel's record, so what ran
// before main (loading, static initialisation) counts too. Accurate to a clock tick (10 ms).
double process_started_unix();

// Adds the seconds from its construction to its end to `sum`, however the scope is left.
struct TimedInto {
  double& sum;
  double t0 = now_s();
  ~TimedInto() { sum += now_s() - t0; }
};

// The best rate of `run`, which does `work` units a call, over calls for about `seconds` (at least
// one), in units per second: the fastest call, so one the scheduler interrupted does not count.
template <class Run>
double best_rate(double work, double seconds, Run run) {
  double best = 0, spent = 0;
  while (spent < seconds) {
    const double t0 = now_s();
    run();
    const double dt = now_s() - t0;
    spent += dt;
    best = std::max(best, work / dt);
  }
  return best;
}

// "2026-12-01T13:45:07Z"
inline std::string iso_utc(double unix_s) {
  const std::time_t t = static_cast<std::time_t>(unix_s);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace pipetrain
