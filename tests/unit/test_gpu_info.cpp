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

TEST_CASE("a GPU's dense peak: SMs x maximum clock x FLOPs per SM and cycle of its capability and dtype") {
  gpu::DeviceInfo a100;  // NVIDIA's A100 figures: 19.5 TFLOP/s fp32, 312 bf16 dense, at 1410 MHz on 108 SMs
  a100.capability_major = 8;
  a100.multiprocessors = 108;
  a100.clock_khz = 1410000;
  CHECK(gpu::peak_gflops(a100, Dtype::fp32) == Approx(19492).epsilon(1e-3));
  CHECK(gpu::peak_gflops(a100, Dtype::bf16) == Approx(311869).epsilon(1e-3));
  gpu::DeviceInfo h100 = h200(gpu::ComputeMode::shared);  // H100 SXM's 66.9 TFLOP/s fp32 on 132 SMs at 1980 MHz
  h100.multiprocessors = 132;
  h100.clock_khz = 1980000;
  CHECK(gpu::peak_gflops(h100, Dtype::fp32) == Approx(66908).epsilon(1e-3));
  gpu::DeviceInfo unknown = a100;
  unknown.capability_major = 6;
  CHECK(gpu::peak_gflops(unknown, Dtype::bf16) == 0);
}
