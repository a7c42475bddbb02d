// Every layer's backward against central finite differences of its forward (see gradcheck.hpp
// for the tolerances). Each test builds loss = sum(out * R) for a random R, so dL/dout = R.
#include <catch2/catch.hpp>

#include "gradcheck.hpp"
#include "pipetrain/compute/kernels.hpp"

using namespace pipetrain;
using gradcheck::check;
using gradcheck::dot;
using gradcheck::randn;

TEST_CASE("layernorm backward matches finite differences", "[kernels]") {
  const int N = 6, C = 8;
  auto x = randn(N * C, 1.f, 1), w = randn(C, 1.f, 2), b = randn(C, 1.f, 3), r = randn(N * C, 1.f, 4);
  std::vector<float> out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    return dot(out, r);
  };
  loss();
  std::vector<float> dx(N * C, 0.f), dw(C, 0.f), db(C, 0.f);
  layernorm_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
  check("dx", loss, x.data(), dx.data(), x.size());
  check("dweight", loss, w.data(), dw.data(), w.size());
  check("dbias", loss, b.data(), db.data(), b.size());
}

TEST_CASE("matmul backward matches finite differences", "[kernels]") {
  const int N = 5, C = 7, OC = 6;
  auto x = randn(N * C, 1.f, 1), w = randn(OC * C, 1.f, 2), b = randn(OC, 1.f, 3), r = randn(N * OC, 1.f, 4);
  std::vector<float> out(N * OC);
  auto loss = [&] {
    matmul_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
    return dot(out, r);
  };
  loss();
  // Pre-filled: parameter gradients must accumulate (+=), the input gradient be overwritten.
  std::vector<float> dx(N * C, 0.5f), dw(OC * C, 0.5f), db(OC, 0.5f);
  matmul_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), N, C, OC);
  for (auto* g : {&dw, &db})
    for (auto& v : *g) v -= 0.5f;
  check("dinp", loss, x.data(), dx.data(), x.size());
  check("dweight", loss, w.data(), dw.data(), w.size());
  check("dbias", loss, b.data(), db.data(), b.size());
}

TEST_CASE("matmul forward is inp * weight^T + bias", "[kernels]") {
  const float x[2 * 3] = {1, 2, 3, 4, 5, 6};
  const float w[2 * 3] = {1, 0, -1, 0.5f, 0.5f, 0.5f};  // [OC=2, C=3]
  const float b[2] = {10, 20};
  float out[4];
  matmul_forward(out, x, w, b, 2, 3, 2);
  CHECK(out[0] == Approx(1 - 3 + 10));
  CHECK(out[1] == Approx(3 + 20));
  CHECK(out[2] == Approx(4 - 6 + 10));
  CHECK(out[3] == Approx(7.5 + 20));
}

TEST_CASE("attention backward matches finite differences", "[kernels]") {
  const int B = 2, T = 5, C = 8, NH = 2;
  auto qkv = randn(B * T * 3 * C, 1.f, 1), r = randn(B * T * C, 1.f, 2);
  std::vector<float> out(B * T * C), att(B * NH * T * T);
  auto loss = [&] {
    attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    return dot(out, r);
  };
  loss();
  std::vector<float> dqkv(qkv.size(), 0.5f);  // overwritten, not added to
  attention_backward(dqkv.data(), r.data(), qkv.data(), att.data(), B, T, C, NH);
  check("dqkv", loss, qkv.data(), dqkv.data(), qkv.size(), 40);
}

TEST_CASE("attention is causal and matches a naive per-head reference", "[kernels]") {
  const int B = 1, T = 4, C = 6, NH = 2, hs = C / NH;
  auto qkv = randn(B * T * 3 * C, 1.f, 7);
  std::vector<float> out(B * T * C), att(B * NH * T * T);
  attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  for (int h = 0; h < NH; ++h)
    for (int t = 0; t < T; ++t) {
      // naive: softmax over u <= t of q_t . k_u / sqrt(hs), then sum of p_u v_u
      std::vector<double> p(t + 1);
      double mx = -1e30, z = 0;
      for (int u = 0; u <= t; ++u) {
        double s = 0;
        for (int i = 0; i < hs; ++i) s += qkv[t * 3 * C + h * hs + i] * qkv[u * 3 * C + C + h * hs + i];
        p[u] = s / std::sqrt(static_cast<double>(hs));
        mx = std::max(mx, p[u]);
      }
      for (auto& v : p) z += (v = std::exp(v - mx));
      for (int i = 0; i < hs; ++i) {
        double o = 0;
        for (int u = 0; u <= t; ++u) o += p[u] / z * qkv[u * 3 * C + 2 * C + h * hs + i];
        CHECK(out[t * C + h * hs + i] == Approx(o).epsilon(1e-5).margin(1e-6));
      }
      for (int u = t + 1; u < T; ++u) CHECK(att[(h * T + t) * T + u] == 0.f);
    }
}

TEST_CASE("gelu backward matches finite differences and the tanh formula", "[kernels]") {
  auto x = randn(50, 2.f, 1), r = randn(50, 1.f, 2);
  std::vector<float> out(50);
  auto loss = [&] {
    gelu_forward(out.data(), x.data(), x.size());
    return dot(out, r);
  };
  loss();
  std::vector<float> dx(50, 0.5f);  // overwritten, not added to
  gelu_backward(dx.data(), x.data(), r.data(), x.size());
  check("dinp", loss, x.data(), dx.data(), x.size(), 50);
  const double x0 = 1.3;
  const double ref = 0.5 * x0 * (1 + std::tanh(std::sqrt(2 / M_PI) * (x0 + 0.044715 * x0 * x0 * x0)));
  float in = static_cast<float>(x0), o;
  gelu_forward(&o, &in, 1);
  CHECK(o == Approx(ref).epsilon(1e-6));
}

TEST_CASE("fast_tanh stays within 1e-6 of std::tanh everywhere", "[kernels]") {
  double worst = 0;
  for (float x = -20.f; x <= 20.f; x += 1e-3f) worst = std::max(worst, std::abs(double(fast_tanh(x)) - std::tanh(double(x))));
  CHECK(worst < 1e-6);
  CHECK(fast_tanh(0.f) == 0.f);
  CHECK(fast_tanh(100.f) == Approx(1.0).margin(1e-7));
}

TEST_CASE("fused bias + GELU and bias + residual equal the unfused kernels", "[kernels]") {
  const int N = 9, C = 5;
  auto pre = randn(N * C, 1.f, 1), bias = randn(C, 1.f, 2), a = randn(N * C, 1.f, 3), b = randn(N * C, 1.f, 4);
  std::vector<float> with_bias(pre), expected(N * C), out(N * C);
  for (int i = 0; i < N; ++i)
    for (int c = 0; c < C; ++c) with_bias[i * C + c] += bias[c];
  gelu_forward(expected.data(), with_bias.data(), expected.size());
  bias_gelu_forward(pre.data(), out.data(), bias.data(), N, C);
  CHECK(pre == with_bias);  // the biased pre-activation is kept for backward
  CHECK(out == expected);
  residual_forward(out.data(), a.data(), b.data(), bias.data(), N, C);
  for (int i = 0; i < N; ++i)
    for (int c = 0; c < C; ++c) CHECK(out[i * C + c] == a[i * C + c] + b[i * C + c] + bias[c]);
}

TEST_CASE("fast_exp stays within 3 ulps of std::exp over the softmax range", "[kernels]") {
  double worst = 0;
  for (float x = -87.f; x <= 88.f; x += 1e-3f)
    worst = std::max(worst, std::abs(double(fast_exp(x)) - std::exp(double(x))) / std::exp(double(x)));
  CHECK(worst < 3 * 6e-8);  // 3 ulps of float's 2^-24 relative spacing, roughly
  CHECK(fast_exp(0.f) == 1.f);
  CHECK(fast_exp(-1000.f) < 1e-37f);
  CHECK(fast_exp(-1000.f) >= 0.f);
}

TEST_CASE("encoder backward scatters into the rows of the tokens used", "[kernels]") {
  const int B = 2, T = 3, C = 4, V = 5;
  const int tokens[B * T] = {1, 3, 1, 4, 0, 1};
  auto wte = randn(V * C, 1.f, 1), wpe = randn(T * C, 1.f, 2), r = randn(B * T * C, 1.f, 3);
  std::vector<float> out(B * T * C);
  auto loss = [&] {
    encoder_forward(out.data(), tokens, wte.data(), wpe.data(), B, T, C);
    return dot(out, r);
  };
  loss();
  std::vector<float> dwte(V * C, 0.f), dwpe(T * C, 0.f);
  encoder_backward(dwte.data(), dwpe.data(), r.data(), tokens, B, T, C);
  check("dwte", loss, wte.data(), dwte.data(), wte.size(), 20);
  check("dwpe", loss, wpe.data(), dwpe.data(), wpe.size(), 12);
  for (int c = 0; c < C; ++c) CHECK(dwte[2 * C + c] == 0.f);  // token 2 never appears
}

TEST_CASE("softmax cross-entropy backward matches finite differences", "[kernels]") {
  const int N = 4, V = 9;
  const int targets[N] = {0, 8, 3, 3};
  auto logits = randn(N * V, 2.f, 1);
  std::vector<float> probs(N * V);
  auto loss = [&] { return softmax_crossentropy_forward(probs.data(), logits.data(), targets, N, V) / N; };
  double l = loss();
  std::vector<float> dlogits(N * V);
  softmax_crossentropy_backward(dlogits.data(), probs.data(), targets, 1.f / N, N, V);
  check("dlogits", loss, logits.data(), dlogits.data(), logits.size(), 36);
  // uniform logits: loss = log V exactly
  std::vector<float> zeros(N * V, 0.f);
  CHECK(softmax_crossentropy_forward(probs.data(), zeros.data(), targets, N, V) / N == Approx(std::log(9.0)));
  CHECK(l > 0);
}
