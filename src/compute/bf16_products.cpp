#include "pipetrain/compute/bf16_products.hpp"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <set>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pipetrain/compute/kernels.hpp"
#include "pipetrain/compute/parallel_for.hpp"
#include "pipetrain/compute/precision.hpp"
#include "pipetrain/compute/profile.hpp"
#include "pipetrain/util/bfloat16.hpp"
#include "pipetrain/util/clock.hpp"
#include "row_chunks.hpp"

namespace pipetrain {

namespace {

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;
static_assert(product_operands(Dtype::bf16) == Dtype::bf16, "these products are the policy's bf16 ones");

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// C[M,N] (+)= A[M,K] B[K,N] (+ bias[N]): A and B bf16, each row-major or its transpose; C fp32,
// row-major, accumulated into where `accumulate` (a weight gradient summing micro-batches).
struct Product {
  long M, N, K;
  bool a_transposed, b_transposed, accumulate, bias;
  auto key() const { return std::tie(M, N, K, a_transposed, b_transposed, accumulate, bias); }
  bool operator<(const Product& o) const { return key() < o.key(); }
  dnnl::memory::desc a() const { return {{M, K}, dt::bf16, a_transposed ? dims{1, M} : dims{K, 1}}; }
  dnnl::memory::desc b() const { return {{K, N}, dt::bf16, b_transposed ? dims{1, K} : dims{N, 1}}; }
  dnnl::memory::desc c() const { return {{M, N}, dt::f32, dims{N, 1}}; }
  dnnl::memory::desc bias_row() const { return {{1, N}, dt::f32, dims{N, 1}}; }
};

dnnl::matmul::primitive_desc describe(const Product& p) {
  dnnl::primitive_attr attr;
  if (p.accumulate) {
    dnnl::post_ops sum;
    sum.append_sum(1.f);
    attr.set_post_ops(sum);
  }
  const auto d =
      p.bias ? dnnl::matmul::desc(p.a(), p.b(), p.bias_row(), p.c()) : dnnl::matmul::desc(p.a(), p.b(), p.c());
  return dnnl::matmul::primitive_desc(d, attr, cpu_engine());
}

// oneDNN compiles a kernel per shape: made once per shape and thread (the thread-group tests run
// ranks as threads of one process), then reused every micro-batch.
const dnnl::matmul& primitive(const Product& p) {
  thread_local std::map<Product, dnnl::matmul> made;
  auto it = made.find(p);
  if (it == made.end()) it = made.emplace(p, dnnl::matmul(describe(p))).first;
  return it->second;
}

void multiply(const Product& p, const uint16_t* a, const uint16_t* b, const float* bias, float* c) {
  dnnl::engine& engine = cpu_engine();
  thread_local dnnl::stream stream(engine);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, dnnl::memory(p.a(), engine, const_cast<uint16_t*>(a))},
                                             {DNNL_ARG_WEIGHTS, dnnl::memory(p.b(), engine, const_cast<uint16_t*>(b))},
                                             {DNNL_ARG_DST, dnnl::memory(p.c(), engine, c)}};
  if (p.bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(p.bias_row(), engine, const_cast<float*>(bias)));
  primitive(p).execute(stream, args);
  stream.wait();
}

// The bf16 rounding of an operand, in one of three scratch slots per thread (one per operand
// role: weight, input, output gradient), kept from call to call.
enum Slot { weight_slot, input_slot, output_grad_slot };
const uint16_t* rounded(Slot slot, const float* x, size_t n) {
  thread_local std::vector<uint16_t> slots[3];
  std::vector<uint16_t>& s = slots[slot];
  if (s.size() < n) s.resize(n);
  round_to_bf16(s.data(), x, n);
  return s.data();
}

// The open Bf16WeightScope's slab and its bf16 copy: which weight ranges (offset, length) this
// step has rounded.
struct WeightCopy {
  const float* slab = nullptr;
  size_t n = 0;
  std::vector<uint16_t> rounded;
  std::set<std::pair<size_t, size_t>> done;
};
thread_local WeightCopy step_weights;

const uint16_t* rounded_weight(const float* w, size_t n) {
  WeightCopy& c = step_weights;
  if (!c.slab || w < c.slab || w + n > c.slab + c.n) return rounded(weight_slot, w, n);
  const size_t offset = static_cast<size_t>(w - c.slab);
  if (c.rounded.size() < c.n) c.rounded.resize(c.n);
  if (c.done.emplace(offset, n).second) round_to_bf16(c.rounded.data() + offset, w, n);
  return c.rounded.data() + offset;
}

const char* isa_text(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::avx512_core_amx:
      return "AVX-512 with AMX";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "AVX-512 with AVX512_BF16";
    case dnnl::cpu_isa::avx512_core_vnni:
    case dnnl::cpu_isa::avx512_core:
      return "AVX-512 without AVX512_BF16";
    case dnnl::cpu_isa::avx2_vnni:
    case dnnl::cpu_isa::avx2:
      return "AVX2";
    default:
      return "below AVX2";
  }
}

Bf16Products probe() {
  Bf16Products found;
  found.isa = isa_text(dnnl::get_effective_cpu_isa());
  try {
    found.kernel = describe(Product{64, 64, 64, false, true, false, true}).impl_info_str();
  } catch (const dnnl::error&) {
    return found;  // no implementation at all: below AVX-512
  }
  // oneDNN's reference loops compute any type, at a small fraction of any real kernel's rate
  found.available = found.kernel.rfind("ref", 0) != 0;
  found.native = found.kernel.find("bf16") != std::string::npos || found.kernel.find("amx") != std::string::npos;
  return found;
}

}  // namespace

const Bf16Products& bf16_products() {
  static const Bf16Products found = probe();
  return found;
}

std::string bf16_products_line() {
  const Bf16Products& p = bf16_products();
  std::string line = "bf16 products: oneDNN " + p.kernel + " (" + p.isa + "), fp32 accumulation";
  if (!p.native)
    line +=
        " | warning: this CPU has no bf16 instructions, oneDNN emulates them on its fp32 units: the rounding is "
        "a bf16 run's, the speed below fp32's";
  return line;
}

// A plain loop: AVX512_BF16's conversion instruction (32 floats at once) made no step faster on
// AMD Zen 4, where the pass waits on memory, not on the conversion.
void round_to_bf16(uint16_t* out, const float* x, size_t n) {
  parallel_for(n, kElementsPerChunk, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) out[i] = bf16_from_float(x[i]);
  });
}

Bf16WeightScope::Bf16WeightScope(const float* slab, size_t n) {
  step_weights.slab = slab;
  step_weights.n = n;
  step_weights.done.clear();
}

Bf16WeightScope::~Bf16WeightScope() {
  step_weights.slab = nullptr;
  step_weights.n = 0;
}

void set_bf16_product_threads(int threads) { omp_set_num_threads(std::max(1, threads)); }

void matmul_forward_bf16(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC) {
  KernelTimer timer(Kernel::gemm);
  if (N == 0 || OC == 0) return;
  if (C == 0) {  // a sum of nothing: the bias alone
    for (int i = 0; i < N; ++i)
      for (int j = 0; j < OC; ++j) out[static_cast<size_t>(i) * OC + j] = bias ? bias[j] : 0.f;
    return;
  }
  // out[N,OC] = inp[N,C] weight[OC,C]^T + bias
  const uint16_t* w = rounded_weight(weight, static_cast<size_t>(OC) * C);
  const uint16_t* x = rounded(input_slot, inp, static_cast<size_t>(N) * C);
  multiply(Product{N, OC, C, false, true, false, bias != nullptr}, x, w, bias, out);
  count_gemm_flops(2.0 * N * OC * C);
}

void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, int N, int C, int OC) {
  {
    KernelTimer timer(Kernel::gemm);
    const size_t n_out = static_cast<size_t>(N) * OC;
    const uint16_t* d = N && OC && C ? rounded(output_grad_slot, dout, n_out) : nullptr;
    if (dinp && N && C) {  // dinp[N,C] = dout[N,OC] weight[OC,C]
      if (OC == 0) std::fill(dinp, dinp + static_cast<size_t>(N) * C, 0.f);
      else
        multiply(Product{N, C, OC, false, false, false, false}, d, rounded_weight(weight, size_t(OC) * C), nullptr,
                 dinp);
      count_gemm_flops(2.0 * N * OC * C);
    }
    if (dweight && d) {  // dweight[OC,C] += dout^T inp
      multiply(Product{OC, C, N, true, false, true, false}, d, rounded(input_slot, inp, static_cast<size_t>(N) * C),
               nullptr, dweight);
      count_gemm_flops(2.0 * N * OC * C);
    }
  }
  if (dweight && dbias) bias_backward(dbias, dout, N, OC);  // fp32: the policy keeps biases out of the rounding
}

double measure_bf16_gemm_gflops(int n, double seconds) {
  const std::vector<uint16_t> a(static_cast<size_t>(n) * n, bf16_from_float(0.5f)), b(a);
  std::vector<float> c(a.size());
  const Product square{n, n, n, false, false, false, false};
  return best_rate(2.0 * n * n * n, seconds, [&] { multiply(square, a.data(), b.data(), nullptr, c.data()); }) / 1e9;
}

}  // namespace pipetrain
