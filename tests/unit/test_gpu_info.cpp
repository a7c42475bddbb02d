// What a GPU check prints about a device and when ranks may not share it: plain functions over
// gpu::DeviceInfo, tested without a GPU.
#include <catch2/catch.hpp>

#include "pipetrain/compute/gpu.hpp"

using namespace pipetrain;

namespace {
gpu::DeviceInfo h200(gpu::ComputeMode mode) {
  gpu::DeviceInfo info;
  info.name = "NVIDIA H200";
  info.memory_bytes = size_t{150} * 1000 * 1000 * 1000;
  info.capability_major = 9;
  info.capability_minor = 0;
  info.mode = mode;
  info.driver_cuda = 13000;
  info.runtime_cuda = 12080;
  return info;
}
}  // namespace

TEST_CASE("describe names the GPU, its memory, capability, compute mode and CUDA versions") {
  CHECK(gpu::describe(h200(gpu::ComputeMode::shared)) ==
        "NVIDIA H200, 139.7 GiB, compute capability 9.0, compute mode default (shared), driver CUDA 13.0, runtime CUDA "
        "12.8");
  CHECK(gpu::describe(h200(gpu::ComputeMode::exclusive_process)).find("compute mode exclusive-process") !=
        std::string::npos);
}

TEST_CASE("ranks may share a GPU in the default compute mode only") {
  CHECK(gpu::sharing_problem(h200(gpu::ComputeMode::shared), 0, 4).empty());
  CHECK(gpu::sharing_problem(h200(gpu::ComputeMode::exclusive_process), 1, 1).empty());
  const std::string exclusive = gpu::sharing_problem(h200(gpu::ComputeMode::exclusive_process), 1, 2);
  CHECK(exclusive.find("GPU 1 (NVIDIA H200) is in exclusive-process compute mode") == 0);
  CHECK(exclusive.find("2 ranks of this node would share it") != std::string::npos);
  CHECK(gpu::sharing_problem(h200(gpu::ComputeMode::prohibited), 0, 1).find("prohibited") != std::string::npos);
}

TEST_CASE("a GPU's dense peak: the datasheet's where the GPU is listed, else SMs x maximum clock x FLOPs per cycle") {
  // An H200 reports its 1980 MHz maximum clock; its datasheet peak holds at the ~1830 MHz it
  // sustains: 989.4 TFLOP/s bf16 dense and 66.9 fp32, where the maximum clock would claim ~1070.
  gpu::DeviceInfo h200_sxm = h200(gpu::ComputeMode::shared);
  h200_sxm.multiprocessors = 132;
  h200_sxm.clock_khz = 1980000;
  CHECK(gpu::peak_gflops(h200_sxm, Dtype::bf16) == Approx(989400));
  CHECK(gpu::peak_gflops(h200_sxm, Dtype::fp32) == Approx(66900));
  CHECK(gpu::peak_basis(h200_sxm, Dtype::bf16).find("datasheet") != std::string::npos);
  gpu::DeviceInfo nvl = h200_sxm;  // the NVL boards: the same SMs at lower clocks
  nvl.name = "NVIDIA H200 NVL";
  CHECK(gpu::peak_gflops(nvl, Dtype::bf16) == Approx(835500));
  gpu::DeviceInfo a100;  // listed too: 19.5 TFLOP/s fp32, 312 bf16 dense
  a100.capability_major = 8;
  a100.multiprocessors = 108;
  a100.clock_khz = 1410000;
  CHECK(gpu::peak_gflops(a100, Dtype::fp32) == Approx(19500));
  CHECK(gpu::peak_gflops(a100, Dtype::bf16) == Approx(312000));
  gpu::DeviceInfo unlisted = h200_sxm;  // a capability 9.0 part with other SMs: the clock formula, an upper bound
  unlisted.multiprocessors = 100;
  CHECK(gpu::peak_gflops(unlisted, Dtype::bf16) ==
        Approx(4096.0 * 100 * 1.98));  // GFLOP/s: per SM and cycle x SMs x GHz
  CHECK(gpu::peak_basis(unlisted, Dtype::bf16).find("upper bound") != std::string::npos);
  gpu::DeviceInfo unknown = a100;
  unknown.capability_major = 6;
  CHECK(gpu::peak_gflops(unknown, Dtype::bf16) == 0);
}
