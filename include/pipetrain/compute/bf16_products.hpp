#pragma once
// The CPU's dense matrix products under model.dtype = bf16 (precision.hpp says what is rounded):
// operands rounded to bfloat16, products through oneDNN's matmul, which accumulates in fp32. The
// BLAS has no bf16 product (Debian's OpenBLAS 0.3.21 none at all), oneDNN runs the CPU's bf16
// dot-product instructions (AVX512_BF16, AMX) where it has them, emulates them on AVX-512 cores
// without, and has none below AVX-512.
#include <cstddef>
#include <cstdint>
#include <string>

namespace pipetrain {

// What oneDNN runs a bf16 product with on this CPU, found once per process.
struct Bf16Products {
  bool available = false;  // oneDNN has a bf16 product for this CPU
  bool native = false;     // ... on the CPU's bf16 instructions; else emulated on its fp32 units
  std::string kernel;      // oneDNN's implementation, e.g. "brg:avx512_core_bf16"
  std::string isa;         // the instruction set oneDNN found, e.g. "AVX-512 with AVX512_BF16"
};
const Bf16Products& bf16_products();
// What the start line says of them: "bf16 products: oneDNN brg:avx512_core_bf16 (AVX-512 with
// AVX512_BF16), fp32 accumulation", with a warning where they are emulated.
std::string bf16_products_line();

// The kernel table's products under bf16: layer_kernels.hpp's matmul contract.
void matmul_forward_bf16(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC);
void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, int N, int C, int OC);

// Within a training step a weight does not change once a product has used it: the optimizer runs
// after the schedule, and ZeRO-1's updated weights arrive before a chunk's first forward. While a
// scope is open over the stage's weight slab (the trainer opens one around each step's schedule),
// each weight matrix in it is rounded on its first product of the step and that copy serves every
// later forward and backward of the step: once per step, not twice per micro-batch. Outside a scope
// (evaluation, generation) and for weights outside the slab (ZeRO-3's gathered layers), every
// product rounds its weight itself. The copy, 2 bytes per weight of the slab, is made on the first
// bf16 product and kept; one scope per thread (ranks run as threads in the thread-group tests).
class Bf16WeightScope {
 public:
  Bf16WeightScope(const float* slab, size_t n);
  ~Bf16WeightScope();
  Bf16WeightScope(const Bf16WeightScope&) = delete;
  Bf16WeightScope& operator=(const Bf16WeightScope&) = delete;
};

// out[i] = x[i] rounded to bf16, to nearest even (bf16_from_float): the products' rounding.
void round_to_bf16(uint16_t* out, const float* x, size_t n);

// Threads oneDNN's products use (its OpenMP runtime's), set beside the BLAS's.
void set_bf16_product_threads(int threads);

// The rate bf16 products reach on n x n x n squares (best of repeats for ~`seconds`), in GFLOP/s,
// operands already bf16: what MFU's "BLAS rate" is under bf16.
double measure_bf16_gemm_gflops(int n = 256, double seconds = 0.05);

}  // namespace pipetrain
