#include "pipetrain/compute/ops.hpp"

#include "pipetrain/compute/gpu_kernels.hpp"

namespace pipetrain {

const Kernels& kernels(Device d) {
#define PIPETRAIN_CPU_KERNEL(ret, name, params) pipetrain::name,
#define PIPETRAIN_GPU_KERNEL(ret, name, params) gpu::name,
  static const Kernels cpu{PIPETRAIN_LAYER_KERNELS(PIPETRAIN_CPU_KERNEL)};
  static const Kernels gpu{PIPETRAIN_LAYER_KERNELS(PIPETRAIN_GPU_KERNEL)};
#undef PIPETRAIN_CPU_KERNEL
#undef PIPETRAIN_GPU_KERNEL
  return d == Device::gpu ? gpu : cpu;
}

}  // namespace pipetrain
