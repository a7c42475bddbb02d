// What a GPU is and whether ranks may share it: plain C++ over gpu::DeviceInfo, the same in every
// build, so it is unit-tested on machines without a GPU.
#include <cstdio>

#include "pipetrain/compute/gpu.hpp"

namespace pipetrain::gpu {
namespace {
const char* mode_name(ComputeMode m) {
  switch (m) {
    case ComputeMode::exclusive_process:
      return "exclusive-process";
    case ComputeMode::prohibited:
      return "prohibited";
    default:
      return "default (shared)";
  }
}
}  // namespace

double peak_gflops(const DeviceInfo& info, Dtype dtype) {
  const int cc = 10 * info.capability_major + info.capability_minor;
  // FLOPs per SM per cycle (2 per fused multiply-add): fp32 lanes x 2; dense bf16 tensor-core rate.
  int per_sm = 0;
  if (dtype == Dtype::fp32) per_sm = cc >= 86 ? 256 : cc >= 70 ? 128 : 0;
  else per_sm = cc >= 100 && cc < 110 ? 8192 : cc == 90 ? 4096 : cc == 80 ? 2048 : cc == 86 || cc == 89 ? 1024 : 0;
  return per_sm * static_cast<double>(info.multiprocessors) * info.clock_khz / 1e6;
}

std::string cuda_version(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

std::string describe(const DeviceInfo& info) {
  char memory[32];
  std::snprintf(memory, sizeof memory, "%.1f GiB", info.memory_bytes / (1024.0 * 1024 * 1024));
  return info.name + ", " + memory + ", compute capability " + std::to_string(info.capability_major) + "." +
         std::to_string(info.capability_minor) + ", compute mode " + mode_name(info.mode) + ", driver CUDA " +
         cuda_version(info.driver_cuda) + ", runtime CUDA " + cuda_version(info.runtime_cuda);
}

std::string sharing_problem(const DeviceInfo& info, int device, int ranks_sharing) {
  const std::string gpu = "GPU " + std::to_string(device) + " (" + info.name + ")";
  if (info.mode == ComputeMode::prohibited)
    return gpu + " is in prohibited compute mode: no process may use it (nvidia-smi -c DEFAULT, or another GPU)";
  if (info.mode == ComputeMode::exclusive_process && ranks_sharing > 1)
    return gpu + " is in exclusive-process compute mode, so only one process may use it, but " +
           std::to_string(ranks_sharing) +
           " ranks of this node would share it: run at most as many ranks per node as it has GPUs, or "
           "ask for the default compute mode (nvidia-smi -c DEFAULT)";
  return "";
}

}  // namespace pipetrain::gpu
