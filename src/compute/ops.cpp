#include "pipetrain/compute/ops.hpp"

#include "pipetrain/compute/gpu_kernels.hpp"

namespace pipetrain {

const Kernels& kernels(Device d) {
  static const Kernels cpu{encoder_forward,    encoder_backward,        layernorm_forward, layernorm_backward,
                           matmul_forward,     matmul_backward,         attention_forward, attention_backward,
                           bias_gelu_forward,  gelu_backward,           residual_forward,  softmax_crossentropy_forward,
                           softmax_crossentropy_backward};
  static const Kernels gpu{gpu::encoder_forward,    gpu::encoder_backward,   gpu::layernorm_forward,
                           gpu::layernorm_backward, gpu::matmul_forward,     gpu::matmul_backward,
                           gpu::attention_forward,  gpu::attention_backward, gpu::bias_gelu_forward,
                           gpu::gelu_backward,      gpu::residual_forward,   gpu::softmax_crossentropy_forward,
                           gpu::softmax_crossentropy_backward};
  return d == Device::gpu ? gpu : cpu;
}

}  // namespace pipetrain
