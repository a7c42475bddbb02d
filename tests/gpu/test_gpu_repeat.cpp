// Every GPU backward gives the same bits when run twice on the same inputs (no float atomics, every
// reduction in a fixed order), and every kernel takes zero-size work as a no-op (ZeRO-1's empty
// slabs, a tensor rank without a token of its vocabulary part, an MoE block whose rows were all
// dropped).
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <vector>

#include "gpu_test_util.hpp"
#include "pipetrain/compute/gpu.hpp"
#include "pipetrain/compute/gpu_kernels.hpp"
#include "pipetrain/compute/moe_kernels.hpp"
#include "pipetrain/compute/ops.hpp"

using namespace pipetrain;
using namespace pipetrain::gpu_test;

namespace {

// What a run gives back: its outputs, one after another.
struct Outputs {
  Vec values;
  template <class T>
  void add(const gpu::Buffer<T>& d) {
    const std::vector<T> h = down(d);
    const size_t at = values.size();
    values.resize(at + (sizeof(T) * h.size() + sizeof(float) - 1) / sizeof(float));
    std::memcpy(values.data() + at, h.data(), sizeof(T) * h.size());
  }
  void add(double x) {
    const size_t at = values.size();
    values.resize(at + 2);
    std::memcpy(values.data() + at, &x, sizeof x);
  }
};

// run() twice, each on fresh copies of the same inputs: the same bytes.
void same_bits_twice(const std::function<Outputs()>& run) {
  const Outputs a = run(), b = run();
  REQUIRE(a.values.size() == b.values.size());
  CHECK(std::memcmp(a.values.data(), b.values.data(), sizeof(float) * a.values.size()) == 0);
}

}  // namespace

TEST_CASE("every backward gives the same bits twice", "[gpu]") {
  const int N = 300, C = 70, OC = 50, V = 23, B = 3, T = 100, H = 45;  // N > one column partial's 256 rows
  const Vec x = randn(N * C, 1, 1), w = randn(OC * C, 1, 2), dout = randn(N * OC, 1, 3), g = randn(N * C, 1, 4);
  const Vec wc = randn(C, 1, 5), bc = randn(C, 1, 6), mean = randn(N, 1, 7), rstd = uniform(N, 1, 8);

  SECTION("the embedding: tokens repeat, each row sums its positions in order") {
    const auto tok = tokens(B * T, V, 9);  // 300 positions over 23 rows
    const Vec d = randn(B * T * C, 1, 10);
    same_bits_twice([&] {
      auto d_tok = up(tok);
      auto d_d = up(d), dwte = up(Vec(V * C, 0.5f)), dwpe = up(Vec(T * C, 0.25f));
      gpu::encoder_backward(dwte.data(), dwpe.data(), d_d.data(), d_tok.data(), B, T, C, 0, V, nullptr);
      Outputs o;
      o.add(dwte), o.add(dwpe);
      return o;
    });
  }
  SECTION("layernorm and rmsnorm, input and parameter gradients") {
    same_bits_twice([&] {
      auto d_x = up(x), d_g = up(g), d_w = up(wc), d_m = up(mean), d_r = up(rstd);
      auto dx = up(Vec(N * C)), dw = up(Vec(C)), db = up(Vec(C)), dx2 = up(Vec(N * C)), dw2 = up(Vec(C));
      gpu::layernorm_backward(dx.data(), dw.data(), db.data(), d_g.data(), d_x.data(), d_w.data(), d_m.data(),
                              d_r.data(), N, C);
      gpu::rmsnorm_backward(dx2.data(), dw2.data(), d_g.data(), d_x.data(), d_w.data(), d_r.data(), N, C);
      Outputs o;
      o.add(dx), o.add(dw), o.add(db), o.add(dx2), o.add(dw2);
      return o;
    });
  }
  SECTION("matmul in fp32 and in bf16") {
    for (auto dtype : {Dtype::fp32, Dtype::bf16})
      same_bits_twice([&] {
        const Kernels& k = kernels(Device::gpu, dtype);
        auto d_x = up(x), d_w = up(w), d_dout = up(dout);
        auto dx = up(Vec(N * C)), dw = up(Vec(OC * C)), db = up(Vec(OC));
        k.matmul_backward(dx.data(), dw.data(), db.data(), d_dout.data(), d_x.data(), d_w.data(), N, C, OC);
        Outputs o;
        o.add(dx), o.add(dw), o.add(db);
        return o;
      });
  }
  SECTION("attention, grouped heads, T past several tiles") {
    const int Ta = 150, Ca = 96, NH = 4, NKV = 2, C3 = Ca + 2 * NKV * (Ca / NH);
    const Vec qkv = randn(Ta * C3, 1, 11), d = randn(Ta * Ca, 1, 12);
    same_bits_twice([&] {
      auto d_qkv = up(qkv), d_d = up(d), out = up(Vec(Ta * Ca)), lse = up(Vec(NH * Ta)), dqkv = up(Vec(Ta * C3));
      gpu::attention_forward(out.data(), lse.data(), d_qkv.data(), 1, Ta, Ca, NH, NKV, nullptr);
      gpu::attention_backward(dqkv.data(), d_d.data(), d_qkv.data(), out.data(), lse.data(), 1, Ta, Ca, NH, NKV,
                              nullptr);
      Outputs o;
      o.add(out), o.add(lse), o.add(dqkv);
      return o;
    });
  }
  SECTION("the experts' combine and router backward, the split RMSNorm's") {
    const int E = 5, k = 2;
    const Vec probs = uniform(N * E, 1, 18), ye = randn(N * k * C, 1, 19);
    MoeRouting r;
    moe_route(r, probs.data(), N, E, k, true, N * k);
    same_bits_twice([&] {
      set_compute_device(Device::gpu);
      RoutedSlotsCopy copy;
      const RoutedSlots slots = copy.of(r);
      set_compute_device(Device::cpu);
      auto d_g = up(g), d_x = up(x), d_w = up(wc), d_r = up(rstd), d_probs = up(probs), d_ye = up(ye);
      auto drows = up(Vec(N * k * C)), dweight = up(Vec(N * k)), dlogits = up(Vec(N * E)), dot = up(Vec(N));
      auto dx = up(Vec(N * C)), dw = up(Vec(C));
      gpu::moe_combine_backward(drows.data(), dweight.data(), d_g.data(), d_ye.data(), slots, C);
      gpu::router_backward(dlogits.data(), dweight.data(), d_probs.data(), d_r.data(), slots, true, 0.1f, 0.1f);
      gpu::split_rms_dots(dot.data(), d_g.data(), d_x.data(), d_w.data(), N, C, C, C);
      gpu::split_rms_backward(dx.data(), dw.data(), d_g.data(), d_x.data(), d_w.data(), d_r.data(), dot.data(), N, C, C,
                              C, C, 1.f);
      Outputs o;
      o.add(drows), o.add(dweight), o.add(dlogits), o.add(dot), o.add(dx), o.add(dw);
      return o;
    });
  }
  SECTION("GELU, SwiGLU, rotary embeddings, softmax cross-entropy, the squared norm") {
    const int NH = 2, NKV = 1, hs = C / NH, C3 = C + 2 * NKV * hs;
    const Vec gu = randn(N * 2 * H, 2, 13), dact = randn(N * H, 1, 14), q = randn(N * C3, 1, 15);
    const Vec logits = randn(N * V, 3, 16);
    const auto tgt = tokens(N, V, 17);
    same_bits_twice([&] {
      auto d_x = up(x), d_g = up(g), d_gu = up(gu), d_dact = up(dact), d_q = up(q), d_logits = up(logits);
      auto d_tgt = up(tgt);
      auto dgelu = up(Vec(N * C)), dgu = up(Vec(N * 2 * H)), probs = up(Vec(N * V)), dlogits = up(Vec(N * V));
      auto bias = up(randn(C, 1, 18)), dbias = up(Vec(C));
      gpu::bias_gelu_backward(dgelu.data(), dbias.data(), d_x.data(), bias.data(), d_g.data(), N, C);
      gpu::swiglu_backward(dgu.data(), d_gu.data(), d_dact.data(), N, H);
      gpu::rope_backward(d_q.data(), 1, N, C, NH, NKV, 10000.f, 3, nullptr);
      Outputs o;
      o.add(gpu::softmax_crossentropy_forward(probs.data(), d_logits.data(), d_tgt.data(), N, V));
      gpu::softmax_crossentropy_backward(dlogits.data(), probs.data(), d_tgt.data(), 0.5f, N, V, 0);
      o.add(gpu::sum_of_squares(d_x.data(), x.size()));
      o.add(dgelu), o.add(dbias), o.add(dgu), o.add(d_q), o.add(probs), o.add(dlogits);
      return o;
    });
  }
}

TEST_CASE("zero-size work is a no-op in every kernel", "[gpu]") {
  // Real pointers, so no half of a backward is skipped for a null one: with nothing to do, none may
  // be read or written (compute-sanitizer would see it).
  gpu::Buffer<float> floats(64);
  gpu::Buffer<int> ints(64);
  gpu::Buffer<double> doubles(64);
  float* f = floats.data();
  int* i = ints.data();
  double* d = doubles.data();
  const int C = 8, OC = 5, V = 50;
  REQUIRE_NOTHROW([&] {
    gpu::encoder_forward(f, i, f, f, 0, 5, C, 0, 4, nullptr);
    gpu::encoder_backward(f, f, f, i, 0, 5, C, 0, 4, nullptr);
    gpu::layernorm_forward(f, f, f, f, f, f, 0, C);
    gpu::layernorm_backward(f, f, f, f, f, f, f, f, 0, C);
    gpu::rmsnorm_forward(f, f, f, f, 0, C, 1e-5f);
    gpu::rmsnorm_backward(f, f, f, f, f, f, 0, C);
    gpu::rope_forward(f, 0, 4, C, 2, 1, 1e4f, 0, nullptr);
    gpu::rope_backward(f, 0, 4, C, 2, 1, 1e4f, 0, nullptr);
    gpu::attention_forward(f, f, f, 0, 4, C, 2, 1, nullptr);
    gpu::attention_backward(f, f, f, f, f, 0, 4, C, 2, 1, nullptr);
    gpu::attention_forward(f, f, f, 2, 0, C, 2, 1, nullptr);
    gpu::attention_backward(f, f, f, f, f, 2, 0, C, 2, 1, nullptr);
    gpu::bias_gelu_forward(f, f, f, 0, C);
    gpu::gelu_forward(f, f, 0);
    gpu::bias_gelu_backward(f, f, f, f, f, 0, C);
    gpu::swiglu_forward(f, f, 0, C);
    gpu::swiglu_backward(f, f, f, 0, C);
    gpu::residual_forward(f, f, f, f, 0, C);
    CHECK(gpu::softmax_crossentropy_forward(f, f, i, 0, V) == 0);
    gpu::softmax_crossentropy_backward(f, f, i, 1.f, 0, V, 0);
    gpu::vocab_softmax_max(f, f, 0, V);
    gpu::vocab_softmax_exp(f, d, f, f, i, 0, V, 0);
    CHECK(gpu::vocab_softmax_finish(f, f, d, 0, V) == 0);
    gpu::adamw_update(f, f, f, f, 0, .9f, .95f, 1e-3f, 1.f, 1e-8f, 1.f, 1.f);
    CHECK(gpu::sum_of_squares(f, 0) == 0);
    for (auto dtype : {Dtype::fp32, Dtype::bf16}) {
      const Kernels& k = kernels(Device::gpu, dtype);
      k.matmul_forward(f, f, f, f, 0, C, OC);
      k.matmul_backward(f, f, f, f, f, f, 0, C, OC);
    }
    // A micro-batch with no token, and one whose rows were all dropped (N tokens, 0 rows)
    for (int n : {0, 3}) {
      const RoutedSlots none{n, 2, 4, 0, i, f, i, i, i};
      if (n == 0) {
        gpu::router_softmax_forward(f, f, f, 0, 4);
        gpu::router_backward(f, f, f, f, none, true, 1.f, 1.f);
        gpu::moe_combine_forward(f, f, none, C, true);
        gpu::moe_combine_backward(f, f, f, f, none, C);
        gpu::moe_scatter_add(f, f, none, C);
      }
      gpu::moe_gather(f, f, none, C);
    }
    gpu::shared_gate_forward(f, f, f, 0, C);
    gpu::shared_gate_backward(f, f, f, f, f, 0, C);
    gpu::sigmoid_backward(f, f, f, 0);
    gpu::split_rms_squares(f, f, 0, C, C);
    gpu::split_rms_forward(f, f, f, f, f, 0, C, C, C, C, 1e-6f);
    gpu::split_rms_dots(f, f, f, f, 0, C, C, C);
    gpu::split_rms_backward(f, f, f, f, f, f, f, 0, C, C, C, C, 1.f);
    gpu::synchronize();
  }());
  // A product over an empty inner dimension is zero: out = bias. An empty micro-batch adds nothing
  // to the parameter gradients.
  const int N = 3;
  const Vec bias = randn(OC, 1, 1), held_w = randn(OC * C, 1, 2), held_b = randn(OC, 1, 3);
  for (auto dtype : {Dtype::fp32, Dtype::bf16}) {
    const Kernels& k = kernels(Device::gpu, dtype);
    auto d_bias = up(bias), out = up(Vec(N * OC, 7.f)), w = up(randn(OC * C, 1, 4)), dw = up(held_w), db = up(held_b);
    k.matmul_forward(out.data(), f, f, d_bias.data(), N, 0, OC);
    Vec want;
    for (int n = 0; n < N; ++n) want.insert(want.end(), bias.begin(), bias.end());
    CHECK(down(out) == want);
    k.matmul_backward(f, dw.data(), db.data(), f, f, w.data(), 0, C, OC);
    CHECK(down(dw) == held_w);
    CHECK(down(db) == held_b);
  }
}
