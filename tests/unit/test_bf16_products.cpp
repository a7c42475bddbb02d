// model.dtype = bf16 on the CPU: the precision policy's table, and the CPU kernels holding to it.
// The products are checked against double-precision products of operands this file rounds itself
// (frexp and nearbyint: not the library's bit trick), and each operand of the policy is perturbed
// below bf16's resolution to show it is rounded (nothing changes) or kept fp32 (something does).
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gradcheck.hpp"
#include "pipetrain/compute/bf16_products.hpp"
#include "pipetrain/compute/blas.hpp"
#include "pipetrain/compute/cpu_features.hpp"
#include "pipetrain/compute/kernels.hpp"
#include "pipetrain/compute/ops.hpp"
#include "pipetrain/compute/precision.hpp"
#include "pipetrain/util/bfloat16.hpp"

using namespace pipetrain;
using gradcheck::randn;
using Vec = std::vector<float>;

namespace {

// Round to bfloat16's 8 significant bits, ties to even (the default rounding mode's nearbyint).
float bf16_round(float x) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e = 0;
  const double m = std::frexp(static_cast<double>(x), &e);  // x = m 2^e, 0.5 <= |m| < 1
  return static_cast<float>(std::ldexp(std::nearbyint(std::ldexp(m, 8)), e - 8));
}
Vec rounded(const Vec& v) {
  Vec r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = bf16_round(v[i]);
  return r;
}

// c[M,N] = a[M,K] b[K,N] in double; a and b given through element functions.
template <class A, class B>
std::vector<double> product(int M, int N, int K, A a, B b) {
  std::vector<double> c(static_cast<size_t>(M) * N, 0.0);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j)
      for (int k = 0; k < K; ++k) c[static_cast<size_t>(i) * N + j] += static_cast<double>(a(i, k)) * b(k, j);
  return c;
}

// |got - want| / |want| over the whole array (want's norm 0: got's norm).
double rel_err(const Vec& got, const std::vector<double>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(diff / (norm > 0 ? norm : 1));
}

bool same_bits(const Vec& a, const Vec& b) {
  return a.size() == b.size() && !std::memcmp(a.data(), b.data(), 4 * a.size());
}

// Whether this CPU can run the bf16 products; where it cannot, that they are refused for want of AVX-512.
bool runs_bf16() {
  if (bf16_products().available) return true;
  CHECK(cpu_features().level != SimdLevel::avx512);
  WARN("no bf16 products on this CPU (" << bf16_products().isa << "): the bf16 checks do not run here");
  return false;
}

}  // namespace

TEST_CASE("the precision policy rounds a dense product's three operands under bf16 and nothing else", "[precision]") {
  for (StepTensor t : kStepTensors) {
    INFO("tensor " << static_cast<int>(t));
    CHECK(dtype_of(t, Dtype::fp32) == Dtype::fp32);
    const bool operand =
        t == StepTensor::product_input || t == StepTensor::product_weight || t == StepTensor::product_output_grad;
    CHECK(dtype_of(t, Dtype::bf16) == (operand ? Dtype::bf16 : Dtype::fp32));
  }
  CHECK(product_operands(Dtype::bf16) == Dtype::bf16);
  CHECK(product_operands(Dtype::fp32) == Dtype::fp32);
}

TEST_CASE("bf16 products are exact products of the rounded operands, accumulated in fp32", "[precision][bf16]") {
  if (!runs_bf16()) return;
  const Kernels& k = kernels(Device::cpu, Dtype::bf16);
  struct Shape {
    int N, C, OC;
  };
  for (const Shape s : {Shape{13, 35, 29}, Shape{1, 64, 3}, Shape{64, 256, 768}, Shape{7, 1, 5}}) {
    const int N = s.N, C = s.C, OC = s.OC;
    INFO("N " << N << " C " << C << " OC " << OC);
    const Vec x = randn(size_t(N) * C, 1, 1), w = randn(size_t(OC) * C, 0.2f, 2), bias = randn(OC, 1, 3),
              dout = randn(size_t(N) * OC, 1, 4);
    const Vec rx = rounded(x), rw = rounded(w), rd = rounded(dout);
    Vec out(size_t(N) * OC);
    k.matmul_forward(out.data(), x.data(), w.data(), bias.data(), N, C, OC);
    std::vector<double> want = product(
        N, OC, C, [&](int i, int c) { return rx[size_t(i) * C + c]; },
        [&](int c, int o) { return rw[size_t(o) * C + c]; });
    for (int i = 0; i < N; ++i)
      for (int o = 0; o < OC; ++o) want[size_t(i) * OC + o] += bias[o];
    CHECK(rel_err(out, want) < 1e-6);
    // The rounding is there: against the unrounded operands the product is off by about 2^-9.
    std::vector<double> exact = product(
        N, OC, C, [&](int i, int c) { return x[size_t(i) * C + c]; },
        [&](int c, int o) { return w[size_t(o) * C + c]; });
    for (int i = 0; i < N; ++i)
      for (int o = 0; o < OC; ++o) exact[size_t(i) * OC + o] += bias[o];
    CHECK(rel_err(out, exact) > 1e-4);
    CHECK(rel_err(out, exact) < 1.0 / 128);

    // Backward: dinp overwritten, dweight and dbias added to; dbias sums the fp32 dout.
    const Vec dw0 = randn(size_t(OC) * C, 1, 5), db0 = randn(OC, 1, 6);
    Vec dx = randn(size_t(N) * C, 1, 7), dw = dw0, db = db0;
    k.matmul_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), N, C, OC);
    CHECK(rel_err(dx, product(
                          N, C, OC, [&](int i, int o) { return rd[size_t(i) * OC + o]; },
                          [&](int o, int c) { return rw[size_t(o) * C + c]; })) < 1e-6);
    std::vector<double> want_dw = product(
        OC, C, N, [&](int o, int i) { return rd[size_t(i) * OC + o]; },
        [&](int i, int c) { return rx[size_t(i) * C + c]; });
    for (size_t i = 0; i < want_dw.size(); ++i) want_dw[i] += dw0[i];
    CHECK(rel_err(dw, want_dw) < 1e-6);
    std::vector<double> want_db(db0.begin(), db0.end());
    for (int i = 0; i < N; ++i)
      for (int o = 0; o < OC; ++o) want_db[o] += dout[size_t(i) * OC + o];
    CHECK(rel_err(db, want_db) < 1e-6);

    // Each half alone gives the same bits as both together (the zero-bubble schedules split them).
    Vec dx_alone(dx.size()), dw_alone = dw0, db_alone = db0;
    k.matmul_backward(dx_alone.data(), nullptr, nullptr, dout.data(), x.data(), w.data(), N, C, OC);
    k.matmul_backward(nullptr, dw_alone.data(), db_alone.data(), dout.data(), x.data(), w.data(), N, C, OC);
    CHECK(same_bits(dx_alone, dx));
    CHECK(same_bits(dw_alone, dw));
    CHECK(same_bits(db_alone, db));
  }
}

TEST_CASE("under bf16 the operands the policy rounds are rounded and the rest stay fp32", "[precision][bf16]") {
  if (!runs_bf16()) return;
  const Kernels& k = kernels(Device::cpu, Dtype::bf16);
  // Operands already on bf16's grid, then moved by 2^-12 of themselves: under half a bf16 step,
  // so a rounded operand rounds back to what it was and the outputs keep their bits, while one
  // kept fp32 changes them.
  const int N = 6, C = 16, OC = 12;
  auto on_grid = [](size_t n, uint32_t seed) { return rounded(randn(n, 1, seed)); };
  auto nudged = [](Vec v) {
    for (float& f : v) f += std::ldexp(f, -12);
    return v;
  };
  const Vec x = on_grid(N * C, 1), w = on_grid(OC * C, 2), bias = on_grid(OC, 3), dout = on_grid(N * OC, 4);
  struct Outputs {
    Vec out, dx, dw, db;
  };
  auto run = [&](const Vec& x_, const Vec& w_, const Vec& b_, const Vec& d_) {
    Outputs o{Vec(N * OC), Vec(N * C), Vec(OC * C), Vec(OC)};
    k.matmul_forward(o.out.data(), x_.data(), w_.data(), b_.data(), N, C, OC);
    k.matmul_backward(o.dx.data(), o.dw.data(), o.db.data(), d_.data(), x_.data(), w_.data(), N, C, OC);
    return o;
  };
  const Outputs base = run(x, w, bias, dout);
  SECTION("product input, weight, output gradient: rounded") {
    for (const Outputs& o : {run(nudged(x), w, bias, dout), run(x, nudged(w), bias, dout)}) {
      CHECK(same_bits(o.out, base.out));
      CHECK(same_bits(o.dx, base.dx));
      CHECK(same_bits(o.dw, base.dw));
    }
    const Outputs d = run(x, w, bias, nudged(dout));
    CHECK(same_bits(d.dx, base.dx));
    CHECK(same_bits(d.dw, base.dw));
    CHECK_FALSE(same_bits(d.db, base.db));  // the bias gradient sums the fp32 output gradient
  }
  SECTION("bias: fp32") { CHECK_FALSE(same_bits(run(x, w, nudged(bias), dout).out, base.out)); }
  SECTION("attention, norm, activation, loss: fp32 (the fp32 kernels themselves)") {
    const Kernels& fp32 = kernels(Device::cpu, Dtype::fp32);
    CHECK(k.attention_forward == fp32.attention_forward);
    CHECK(k.attention_backward == fp32.attention_backward);
    CHECK(k.layernorm_forward == fp32.layernorm_forward);
    CHECK(k.rmsnorm_forward == fp32.rmsnorm_forward);
    CHECK(k.bias_gelu_forward == fp32.bias_gelu_forward);
    CHECK(k.swiglu_forward == fp32.swiglu_forward);
    CHECK(k.residual_forward == fp32.residual_forward);
    CHECK(k.softmax_crossentropy_forward == fp32.softmax_crossentropy_forward);
    CHECK(k.matmul_forward != fp32.matmul_forward);
    // and an fp32 kernel sees a nudge below bf16's resolution
    const int T = 4, NH = 2, Ca = 8;
    const Vec qkv = on_grid(T * 3 * Ca, 5);
    Vec a(T * Ca), b(T * Ca), lse(NH * T);
    k.attention_forward(a.data(), lse.data(), qkv.data(), 1, T, Ca, NH, NH, nullptr);
    k.attention_forward(b.data(), lse.data(), nudged(qkv).data(), 1, T, Ca, NH, NH, nullptr);
    CHECK_FALSE(same_bits(a, b));
  }
}

TEST_CASE("bf16 products: empty shapes, and the same bits on one thread or two", "[precision][bf16]") {
  if (!runs_bf16()) return;
  const Kernels& k = kernels(Device::cpu, Dtype::bf16);
  const Vec bias = randn(3, 1, 1), none;
  Vec out(2 * 3, 7.f);
  k.matmul_forward(out.data(), none.data(), none.data(), bias.data(), 2, 0, 3);  // a sum of nothing: the bias
  CHECK(out == Vec{bias[0], bias[1], bias[2], bias[0], bias[1], bias[2]});
  k.matmul_forward(out.data(), none.data(), none.data(), nullptr, 0, 5, 3);  // no rows: nothing written
  CHECK(out[0] == bias[0]);

  const int N = 96, C = 128, OC = 384;
  const Vec x = randn(N * C, 1, 2), w = randn(OC * C, 0.1f, 3), dout = randn(N * OC, 1, 4);
  auto step = [&] {
    std::array<Vec, 3> o{Vec(N * OC), Vec(N * C), Vec(OC * C, 0.f)};
    k.matmul_forward(o[0].data(), x.data(), w.data(), nullptr, N, C, OC);
    k.matmul_backward(o[1].data(), o[2].data(), nullptr, dout.data(), x.data(), w.data(), N, C, OC);
    return o;
  };
  set_blas_threads(1);
  const auto one = step();
  set_blas_threads(2);
  const auto two = step();
  set_blas_threads(1);
  for (int i = 0; i < 3; ++i) CHECK(same_bits(one[i], two[i]));
}

TEST_CASE("a step's weight scope rounds each weight once and serves that copy until it closes", "[precision][bf16]") {
  if (!runs_bf16()) return;
  const Kernels& k = kernels(Device::cpu, Dtype::bf16);
  const int N = 8, C = 64, OC = 32;
  const size_t n_w = static_cast<size_t>(OC) * C;
  // A slab of two weight matrices, and one outside it (as ZeRO-3's gathered layers are).
  Vec slab = randn(2 * n_w, 0.1f, 5), outside = randn(n_w, 0.1f, 6);
  const Vec x = randn(N * C, 1, 7);
  auto forward = [&](const float* w) {
    Vec out(N * OC);
    k.matmul_forward(out.data(), x.data(), w, nullptr, N, C, OC);
    return out;
  };
  auto dinp = [&](const float* w) {
    const Vec dout = randn(N * OC, 1, 8);
    Vec d(N * C);
    k.matmul_backward(d.data(), nullptr, nullptr, dout.data(), x.data(), w, N, C, OC);
    return d;
  };
  float* second = slab.data() + n_w;
  const Vec unscoped = forward(second), unscoped_dinp = dinp(second);
  const Vec changed_w = randn(n_w, 0.1f, 9);
  {
    const Bf16WeightScope scope(slab.data(), slab.size());
    CHECK(same_bits(forward(second), unscoped));  // the same rounding as a product's own
    // A weight changed after its first product of the step: the step's copy still serves
    // (the trainer's promise is that none changes), in the forward and in the backward.
    std::copy(changed_w.begin(), changed_w.end(), second);
    CHECK(same_bits(forward(second), unscoped));
    CHECK(same_bits(dinp(second), unscoped_dinp));
    // A weight outside the slab is rounded by each product.
    const Vec before = forward(outside.data());
    outside[0] += 1.f;
    CHECK_FALSE(same_bits(forward(outside.data()), before));
  }
  // The next step's scope rounds the weights anew, and so does a product outside any scope.
  const Vec fresh = forward(second);
  CHECK_FALSE(same_bits(fresh, unscoped));
  const Bf16WeightScope next(slab.data(), slab.size());
  CHECK(same_bits(forward(second), fresh));
}

TEST_CASE("rounding to bf16: to nearest even, in whole chunks and tails", "[precision]") {
  // Ties (exactly halfway: to the even neighbour), values around them, infinities, overflow, zeros,
  // NaN, then random values; lengths that leave a tail after whole vectors of 32.
  std::vector<float> x = {1.f + 0x1p-8f,
                          1.f + 3 * 0x1p-8f,
                          1.f + 0x1p-8f + 0x1p-20f,
                          -(1.f + 0x1p-8f),
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::max(),
                          0.f,
                          -0.f,
                          std::nanf("")};
  const Vec r = randn(1000, 3, 9);
  x.insert(x.end(), r.begin(), r.end());
  for (size_t n : {x.size(), size_t(31), size_t(64), size_t(65)}) {
    std::vector<uint16_t> out(n);
    round_to_bf16(out.data(), x.data(), n);
    for (size_t i = 0; i < n; ++i) {
      INFO(i << ": " << x[i]);
      const float got = float_from_bf16(out[i]);
      if (std::isnan(x[i])) CHECK(std::isnan(got));
      else if (x[i] == std::numeric_limits<float>::max()) CHECK(got == std::numeric_limits<float>::infinity());
      else CHECK(got == bf16_round(x[i]));
    }
  }
  CHECK(float_from_bf16([&] {
          uint16_t h;
          const float tie = 1.f + 0x1p-8f;  // halfway between 1 and 1 + 2^-7: to the even one, 1
          round_to_bf16(&h, &tie, 1);
          return h;
        }()) == 1.f);
}
