#include "pipetrain/compute/ops.hpp"

#include "pipetrain/compute/gpu_kernels.hpp"

namespace pipetrain {

namespace {

Kernels with_bf16_products(Kernels k) {
  k.matmul_forward = gpu::matmul_forward_bf16;
  k.matmul_backward = gpu::matmul_backward_bf16;
  return k;
}

}  // namespace

const Kernels& kernels(Device d, Dtype matmul) {
#define PIPETRAIN_CPU_KERNEL(ret, name, params) pipetrain::name,
#define PIPETRAIN_GPU_KERNEL(ret, name, params) gpu::name,
  static const Kernels cpu{PIPETRAIN_LAYER_KERNELS(PIPETRAIN_CPU_KERNEL)};
  static const Kernels gpu{PIPETRAIN_LAYER_KERNELS(PIPETRAIN_GPU_KERNEL)};
#undef PIPETRAIN_CPU_KERNEL
#undef PIPETRAIN_GPU_KERNEL
  static const Kernels gpu_bf16 = with_bf16_products(gpu);
  if (d == Device::cpu) return cpu;  // validation keeps bf16 off the CPU
  return matmul == Dtype::bf16 ? gpu_bf16 : gpu;
}

}  // namespace pipetrain
