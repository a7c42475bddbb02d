// The layer kernels of one compute device as a table, so Stage runs the same code on the CPU
// (kernels.hpp) and on the GPU (gpu_kernels.hpp): k.matmul_forward(...). The fields are
// layer_kernels.hpp's list.
#pragma once
#include "pipetrain/compute/device.hpp"
#include "pipetrain/compute/kernels.hpp"

namespace pipetrain {

struct Kernels {
#define PIPETRAIN_KERNEL_POINTER(ret, name, params) ret(*name) params;
  PIPETRAIN_LAYER_KERNELS(PIPETRAIN_KERNEL_POINTER)
#undef PIPETRAIN_KERNEL_POINTER
};
// The kernels of device `d` under model.dtype = `model` (precision.hpp: what it changes).
const Kernels& kernels(Device d, Dtype model = Dtype::fp32);

}  // namespace pipetrain
