// Matrix products through cuBLAS, PyTorch's nn.Linear layout as on the CPU: out[N,OC] =
// inp[N,C] W[OC,C]^T + bias. cuBLAS is column-major, so a row-major [R, K] matrix is its
// transpose with leading dimension K; each product below is written for those transposes.
#include <cuda_bf16.h>

#include <algorithm>

#include "pipetrain/compute/gpu.hpp"
#include "pipetrain/compute/gpu_kernels.hpp"
#include "pipetrain/compute/precision.hpp"  // product_operands: what model.dtype rounds
#include "pipetrain/util/clock.hpp"
#include "reduce.cuh"

namespace pipetrain::gpu {

namespace {

__global__ void add_bias_k(float* out, const float* bias, int OC, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] += bias[i % OC];
}
__global__ void to_bf16_k(__nv_bfloat16* out, const float* in, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16_rn(in[i]);
}

// An operand as cuBLAS gets it: the fp32 array itself, or its bf16 rounding in scratch `slot`.
const void* operand(Dtype dtype, const float* x, size_t n, int slot) {
  if (dtype == Dtype::fp32) return x;
  auto* h = static_cast<__nv_bfloat16*>(scratch(slot, sizeof(__nv_bfloat16) * n));
  PT_LAUNCH(to_bf16_k, blocks_for(n), 256, 0, h, x, n);
  return h;
}

// C[m,n] (column-major, fp32) = alpha op(A) op(B) + beta C, A and B from operand().
void gemm(Dtype dtype, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* A, int lda,
          const void* B, int ldb, float beta, float* C, int ldc) {
  if (m == 0 || n == 0) return;  // an empty product (an empty micro-batch or tensor part)
  if (k == 0) {                  // a sum of nothing, which cuBLAS refuses (leading dimension 0)
    if (beta == 0.f) zero(C, sizeof(float) * static_cast<size_t>(ldc) * n);
    return;
  }
  const float alpha = 1.f;
  const cudaDataType in = dtype == Dtype::fp32 ? CUDA_R_32F : CUDA_R_16BF;
  PT_CUDA(cublasGemmEx(cublas(), ta, tb, m, n, k, &alpha, A, in, lda, B, in, ldb, &beta, C, CUDA_R_32F, ldc,
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// Two zeroed n x n operands in the matmul dtype and an output: what the GEMM timers multiply.
struct SquareProduct {
  SquareProduct(int n, Dtype dtype) : n(n), nn(static_cast<size_t>(n) * n), dtype(dtype), a(nn), b(nn), c(nn) {
    zero(a.data(), nn * sizeof(float));
    zero(b.data(), nn * sizeof(float));
    A = operand(dtype, a.data(), nn, 2);
    B = operand(dtype, b.data(), nn, 3);
  }
  void run() { gemm(dtype, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, A, n, B, n, 0.f, c.data(), n); }
  double flops() const { return 2.0 * n * nn; }
  int n;
  size_t nn;
  Dtype dtype;
  Buffer<float> a, b, c;
  const void* A = nullptr;
  const void* B = nullptr;
};

}  // namespace

double measure_gemm_gflops(Dtype dtype, int n, double seconds) {
  SquareProduct p(n, dtype);
  cudaEvent_t start, stop;
  PT_CUDA(cudaEventCreate(&start));
  PT_CUDA(cudaEventCreate(&stop));
  double best = 0, spent = 0;
  for (int rep = 0; rep < 100 && (rep < 3 || spent < seconds); ++rep) {  // the first run warms up
    PT_CUDA(cudaEventRecord(start, stream()));
    p.run();
    PT_CUDA(cudaEventRecord(stop, stream()));
    PT_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    PT_CUDA(cudaEventElapsedTime(&ms, start, stop));
    spent += ms / 1e3;
    if (rep > 0) best = std::max(best, p.flops() / (ms / 1e3) / 1e9);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

double time_gemms(int n, int reps) {
  SquareProduct p(n, Dtype::fp32);
  PT_CUDA(cudaStreamSynchronize(stream()));
  const double t0 = now_s();
  for (int r = 0; r < reps; ++r) p.run();
  PT_CUDA(cudaStreamSynchronize(stream()));
  return now_s() - t0;
}

namespace {

void matmul_forward_in(Dtype dtype, float* out, const float* inp, const float* weight, const float* bias, int N, int C,
                       int OC) {
  const size_t nc = static_cast<size_t>(N) * C, oc = static_cast<size_t>(OC) * C;
  // out^T [OC, N] = W [OC, C] inp^T [C, N]; W is stored as W^T [C, OC] column-major.
  gemm(dtype, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, operand(dtype, weight, oc, 2), C, operand(dtype, inp, nc, 3), C, 0.f,
       out, OC);
  if (bias) {
    const size_t n = static_cast<size_t>(N) * OC;
    PT_LAUNCH(add_bias_k, blocks_for(n), 256, 0, out, bias, OC, n);
  }
}

void matmul_backward_in(Dtype dtype, float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, int N, int C, int OC) {
  const size_t no = static_cast<size_t>(N) * OC;
  const void* d = operand(dtype, dout, no, 4);
  if (dinp)  // dinp^T [C, N] = W^T [C, OC] dout^T [OC, N]  (overwritten)
    gemm(dtype, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, operand(dtype, weight, static_cast<size_t>(OC) * C, 2), C, d, OC,
         0.f, dinp, C);
  if (dweight) {  // dW^T [C, OC] += inp^T [C, N] dout [N, OC]
    gemm(dtype, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, operand(dtype, inp, static_cast<size_t>(N) * C, 3), C, d, OC, 1.f,
         dweight, C);
    if (dbias) column_sum_add(dbias, N, OC, Element{dout, OC}, 0);
  }
}

}  // namespace

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC) {
  matmul_forward_in(product_operands(Dtype::fp32), out, inp, weight, bias, N, C, OC);
}
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC) {
  matmul_backward_in(product_operands(Dtype::fp32), dinp, dweight, dbias, dout, inp, weight, N, C, OC);
}
void matmul_forward_bf16(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC) {
  matmul_forward_in(product_operands(Dtype::bf16), out, inp, weight, bias, N, C, OC);
}
void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, int N, int C, int OC) {
  matmul_backward_in(product_operands(Dtype::bf16), dinp, dweight, dbias, dout, inp, weight, N, C, OC);
}

}  // namespace pipetrain::gpu
