// Monotonic wall-clock seconds, for step, wait and save timings.
#pragma once
#include <chrono>

namespace pipetrain {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace pipetrain
