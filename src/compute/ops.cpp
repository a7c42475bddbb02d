#include "pipetrain/compute/ops.hpp"

#include "pipetrain/compute/bf16_products.hpp"
#include "pipetrain/compute/gpu_kernels.hpp"
#include "pipetrain/compute/precision.hpp"

namespace pipetrain {

namespace {

// A device's table with its dense products' operands in the precision policy's type for `model`:
// the products are the only kernels model.dtype changes.
Kernels with_products_for(Kernels k, Device d, Dtype model) {
  if (product_operands(model) == Dtype::fp32) return k;
  k.matmul_forward = d == Device::cpu ? matmul_forward_bf16 : gpu::matmul_forward_bf16;
  k.matmul_backward = d == Device::cpu ? matmul_backward_bf16 : gpu::matmul_backward_bf16;
  return k;
}

}  // namespace

const Kernels& kernels(Device d, Dtype model) {
#define PIPETRAIN_CPU_KERNEL(ret, name, params) pipetrain::name,
#define PIPETRAIN_GPU_KERNEL(ret, name, params) gpu::name,
  static const Kernels cpu{PIPETRAIN_LAYER_KERNELS(PIPETRAIN_CPU_KERNEL)};
  static const Kernels gpu{PIPETRAIN_LAYER_KERNELS(PIPETRAIN_GPU_KERNEL)};
#undef PIPETRAIN_CPU_KERNEL
#undef PIPETRAIN_GPU_KERNEL
  static const Kernels cpu_bf16 = with_products_for(cpu, Device::cpu, Dtype::bf16);
  static const Kernels gpu_bf16 = with_products_for(gpu, Device::gpu, Dtype::bf16);
  if (d == Device::cpu) return model == Dtype::bf16 ? cpu_bf16 : cpu;
  return model == Dtype::bf16 ? gpu_bf16 : gpu;
}

}  // namespace pipetrain
