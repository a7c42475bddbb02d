// The layer kernels of one compute device as a table, so Stage runs the same code on the CPU
// (kernels.hpp) and on the GPU (gpu_kernels.hpp): k.matmul_forward(...).
#pragma once
#include "pipetrain/compute/device.hpp"
#include "pipetrain/compute/kernels.hpp"

namespace pipetrain {

struct Kernels {
  decltype(&pipetrain::encoder_forward) encoder_forward;
  decltype(&pipetrain::encoder_backward) encoder_backward;
  decltype(&pipetrain::layernorm_forward) layernorm_forward;
  decltype(&pipetrain::layernorm_backward) layernorm_backward;
  decltype(&pipetrain::matmul_forward) matmul_forward;
  decltype(&pipetrain::matmul_backward) matmul_backward;
  decltype(&pipetrain::attention_forward) attention_forward;
  decltype(&pipetrain::attention_backward) attention_backward;
  decltype(&pipetrain::bias_gelu_forward) bias_gelu_forward;
  decltype(&pipetrain::gelu_backward) gelu_backward;
  decltype(&pipetrain::residual_forward) residual_forward;
  decltype(&pipetrain::softmax_crossentropy_forward) softmax_crossentropy_forward;
  decltype(&pipetrain::softmax_crossentropy_backward) softmax_crossentropy_backward;
};
const Kernels& kernels(Device d);

}  // namespace pipetrain
