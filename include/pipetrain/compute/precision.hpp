// model.dtype's precision policy, written once for both devices: which tensors of a training step
// are rounded to bfloat16 and which stay fp32. Both kernel tables are made from it (ops.cpp), and
// both devices' matrix products take their operands' type from it (bf16_products.cpp on the CPU,
// cuda/matmul.cu on the GPU).
//
// Under bf16 the three operands of every dense matrix product (the layers' linear maps, the head,
// the router, the experts) are rounded to nearest even on their way into the product, which
// accumulates in fp32 and writes fp32. Everything else stays fp32: what the products write, the
// biases, attention (its scores, softmax and weighted sums), the norms, activations and residual
// adds, the loss, the weights the optimizer updates (so checkpoints are fp32 and a bf16 run and an
// fp32 run resume each other's), their gradients, AdamW's moments, and every message between ranks.
#pragma once
#include "pipetrain/config/choices.hpp"  // Dtype

namespace pipetrain {

// The tensors of a step, as the policy tells them apart.
enum class StepTensor {
  product_input,        // a dense product's activation operand: inp forward, and in the weight gradient's product
  product_weight,       // a dense product's weight operand
  product_output_grad,  // the output gradient a product's backward multiplies: dout
  product_output,       // what a product writes: out, dinp, and dweight, accumulated
  bias,                 // a product's bias and its gradient (the sum of the fp32 dout)
  attention,            // q, k, v, the scores, their softmax and the weighted sums
  norm,                 // LayerNorm and RMSNorm, their inputs, outputs and statistics
  activation,           // GELU, SwiGLU, residual adds, the embedding
  loss,                 // the logits' softmax and the cross-entropy
  master_weight,        // the weights AdamW updates and checkpoints hold
  gradient,             // the parameter gradients, summed over micro-batches and replicas
  optimizer_state,      // AdamW's first and second moments
  message,              // activations and gradients between stages, tensor and data ranks
};
constexpr StepTensor kStepTensors[] = {
    StepTensor::product_input,  StepTensor::product_weight, StepTensor::product_output_grad,
    StepTensor::product_output, StepTensor::bias,           StepTensor::attention,
    StepTensor::norm,           StepTensor::activation,     StepTensor::loss,
    StepTensor::master_weight,  StepTensor::gradient,       StepTensor::optimizer_state,
    StepTensor::message};

// The type `t` is computed in under model.dtype = `model`.
constexpr Dtype dtype_of(StepTensor t, Dtype model) {
  switch (t) {
    case StepTensor::product_input:
    case StepTensor::product_weight:
    case StepTensor::product_output_grad:
      return model;
    default:
      return Dtype::fp32;
  }
}

// The type a dense product's operands go in as. One type for all three: both devices' product
// libraries (oneDNN, cuBLAS) multiply operands of one type.
constexpr Dtype product_operands(Dtype model) { return dtype_of(StepTensor::product_input, model); }
// The GEMM whose measured rate a step's share is of (metrics' sgemm_gflops keeps its name): OpenBLAS's
// (cuBLAS's) sgemm, or under bf16 the bf16 products'.
constexpr const char* gemm_name(Dtype model) { return model == Dtype::bf16 ? "bf16 GEMM" : "sgemm"; }

static_assert(dtype_of(StepTensor::product_weight, Dtype::bf16) == product_operands(Dtype::bf16) &&
                  dtype_of(StepTensor::product_output_grad, Dtype::bf16) == product_operands(Dtype::bf16),
              "the devices' products take one operand type");

}  // namespace pipetrain
