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

// NVIDIA's datasheet peaks (dense, TFLOP/s) of the GPUs MFU is most often taken on. They hold at the
// clock the GPU sustains under load, below the maximum boost clock the device reports: an H100 SXM's
// 132 SMs x 4096 bf16 FLOPs per cycle reach 989 TFLOP/s at 1830 MHz, where its 1980 MHz maximum
// would claim 1070. Told apart by compute capability and SMs, and the NVL boards (same SMs, lower
// clocks) by name.
struct Datasheet {
  int capability, sms;
  const char* name_part;  // "" for any name
  double fp32_tflops, bf16_tflops;
  const char* board;
};
constexpr Datasheet kDatasheets[] = {
    {90, 132, "NVL", 60.0, 835.5, "H100/H200 NVL"},
    {90, 132, "", 66.9, 989.4, "H100/H200 SXM"},
    {90, 114, "", 51.2, 756.5, "H100 PCIe"},
    {80, 108, "", 19.5, 312.0, "A100"},
};

const Datasheet* datasheet(const DeviceInfo& info) {
  const int cc = 10 * info.capability_major + info.capability_minor;
  for (const Datasheet& d : kDatasheets)
    if (d.capability == cc && d.sms == info.multiprocessors && info.name.find(d.name_part) != std::string::npos)
      return &d;
  return nullptr;
}

// FLOPs per SM per cycle (2 per fused multiply-add): fp32 lanes x 2; the dense bf16 tensor-core rate.
int flops_per_sm_cycle(const DeviceInfo& info, Dtype dtype) {
  const int cc = 10 * info.capability_major + info.capability_minor;
  if (dtype == Dtype::fp32) return cc >= 86 ? 256 : cc >= 70 ? 128 : 0;
  return cc >= 100 && cc < 110 ? 8192 : cc == 90 ? 4096 : cc == 80 ? 2048 : cc == 86 || cc == 89 ? 1024 : 0;
}

}  // namespace

double peak_gflops(const DeviceInfo& info, Dtype dtype) {
  if (const Datasheet* d = datasheet(info)) return 1e3 * (dtype == Dtype::fp32 ? d->fp32_tflops : d->bf16_tflops);
  return flops_per_sm_cycle(info, dtype) * static_cast<double>(info.multiprocessors) * info.clock_khz / 1e6;
}

std::string peak_basis(const DeviceInfo& info, Dtype dtype) {
  char line[256];
  if (const Datasheet* d = datasheet(info)) {
    std::snprintf(line, sizeof line, "%s: %.1f TFLOP/s, the datasheet's dense %s peak of an %s (%d SMs)",
                  info.name.c_str(), dtype == Dtype::fp32 ? d->fp32_tflops : d->bf16_tflops, name_of(dtype), d->board,
                  d->sms);
  } else {
    std::snprintf(line, sizeof line,
                  "%s: %d SMs x %d MHz x %d %s FLOPs per SM and cycle (the maximum clock: no datasheet figure for "
                  "this GPU, so an upper bound)",
                  info.name.c_str(), info.multiprocessors, info.clock_khz / 1000, flops_per_sm_cycle(info, dtype),
                  name_of(dtype));
  }
  return line;
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
