// The llama family's kernels: each backward against central finite differences of its forward
// (gradcheck.hpp), each forward against its published formula written here in double.
#include <catch2/catch.hpp>

#include <cmath>

#include "gradcheck.hpp"
#include "pipetrain/compute/kernels.hpp"

using namespace pipetrain;
using gradcheck::check;
using gradcheck::dot;
using gradcheck::randn;

TEST_CASE("rmsnorm: x / sqrt(mean(x^2) + eps) * w, and its backward matches finite differences", "[kernels]") {
  const int N = 6, C = 8;
  const float eps = 1e-5f;
  auto x = randn(N * C, 1.f, 1), w = randn(C, 1.f, 2), r = randn(N * C, 1.f, 4);
  std::vector<float> out(N * C), rstd(N);
  auto loss = [&] {
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
    return dot(out, r);
  };
  loss();
  for (int i = 0; i < N; ++i) {
    double sq = 0;
    for (int c = 0; c < C; ++c) sq += double(x[i * C + c]) * x[i * C + c];
    const double s = 1 / std::sqrt(sq / C + eps);
    for (int c = 0; c < C; ++c) CHECK(out[i * C + c] == Approx(x[i * C + c] * s * w[c]).epsilon(1e-6));
  }
  // Pre-filled: the input gradient adds (the residual's gradient waits there), the weight's too.
  std::vector<float> dx(N * C, 0.5f), dw(C, 0.5f);
  rmsnorm_backward(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), N, C);
  for (auto* g : {&dx, &dw})
    for (auto& v : *g) v -= 0.5f;
  check("dx", loss, x.data(), dx.data(), x.size());
  check("dweight", loss, w.data(), dw.data(), w.size());
  std::vector<float> dx_only(N * C, 0.f), dw_only(C, 0.f);  // each half alone gives the same
  rmsnorm_backward(dx_only.data(), nullptr, r.data(), x.data(), w.data(), rstd.data(), N, C);
  rmsnorm_backward(nullptr, dw_only.data(), r.data(), x.data(), w.data(), rstd.data(), N, C);
  for (int i = 0; i < N * C; ++i) CHECK(dx_only[i] == Approx(dx[i]).margin(1e-6));
  for (int c = 0; c < C; ++c) CHECK(dw_only[c] == Approx(dw[c]).margin(1e-6));
}

namespace {

// Rotate-half rotary embedding of one head's vector x (hs floats) at position p, in double.
std::vector<double> rotated(const float* x, int hs, int p, double theta) {
  std::vector<double> y(hs);
  const int half = hs / 2;
  for (int i = 0; i < half; ++i) {
    const double a = p * std::pow(theta, -2.0 * i / hs);
    y[i] = x[i] * std::cos(a) - x[i + half] * std::sin(a);
    y[i + half] = x[i + half] * std::cos(a) + x[i] * std::sin(a);
  }
  return y;
}

}  // namespace

TEST_CASE("rope rotates q and k heads by position (rotate-half), leaves v, and backward is its transpose",
          "[kernels]") {
  const int B = 2, T = 5, C = 16, NH = 4, NKV = 2, hs = C / NH, C3 = C + 2 * NKV * hs, pos0 = 3;
  const float theta = 500.f;
  const auto qkv = randn(B * T * C3, 1.f, 1);
  std::vector<float> x = qkv;
  rope_forward(x.data(), B, T, C, NH, NKV, theta, pos0, nullptr);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const size_t row = (static_cast<size_t>(b) * T + t) * C3;
      for (int h = 0; h < NH + NKV; ++h) {  // NH query heads, then NKV key heads
        const auto want = rotated(qkv.data() + row + h * hs, hs, pos0 + t, theta);
        for (int i = 0; i < hs; ++i) CHECK(x[row + h * hs + i] == Approx(want[i]).epsilon(1e-5).margin(1e-6));
      }
      for (int i = C + NKV * hs; i < C3; ++i) CHECK(x[row + i] == qkv[row + i]);  // v untouched
    }
  // Backward: the gradient of sum(rope(x) * r) with respect to x.
  auto in = randn(B * T * C3, 1.f, 2), r = randn(B * T * C3, 1.f, 3);
  std::vector<float> out;
  auto loss = [&] {
    out = in;
    rope_forward(out.data(), B, T, C, NH, NKV, theta, pos0, nullptr);
    return dot(out, r);
  };
  std::vector<float> d = r;
  rope_backward(d.data(), B, T, C, NH, NKV, theta, pos0, nullptr);
  check("dqkv", loss, in.data(), d.data(), in.size(), 40);
}

TEST_CASE("rope of the last rows at an offset equals rope of the whole sequence's last rows", "[kernels]") {
  // What generation relies on: n new tokens at position pos get the angles of positions pos...
  const int T = 7, C = 8, NH = 2, NKV = 1, C3 = C + 2 * NKV * (C / NH), pos = 4;
  const auto qkv = randn(T * C3, 1.f, 5);
  std::vector<float> whole = qkv, tail(qkv.begin() + pos * C3, qkv.end());
  rope_forward(whole.data(), 1, T, C, NH, NKV, 10000.f, 0, nullptr);
  rope_forward(tail.data(), 1, T - pos, C, NH, NKV, 10000.f, pos, nullptr);
  CHECK(std::vector<float>(whole.begin() + pos * C3, whole.end()) == tail);
}

TEST_CASE("swiglu: silu(gate) * up, and its backward matches finite differences", "[kernels]") {
  const int N = 5, H = 6;
  auto gu = randn(N * 2 * H, 2.f, 1), r = randn(N * H, 1.f, 2);
  std::vector<float> out(N * H);
  auto loss = [&] {
    swiglu_forward(out.data(), gu.data(), N, H);
    return dot(out, r);
  };
  loss();
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < H; ++j) {
      const double g = gu[i * 2 * H + j], u = gu[i * 2 * H + H + j];
      CHECK(out[i * H + j] == Approx(g / (1 + std::exp(-g)) * u).epsilon(1e-5).margin(1e-7));
    }
  std::vector<float> dgu(gu.size(), 0.5f);  // overwritten, not added to
  swiglu_backward(dgu.data(), gu.data(), r.data(), N, H);
  check("dgate_up", loss, gu.data(), dgu.data(), gu.size(), 30);
}

TEST_CASE("positions given per row turn rope and pick the position table's rows, forward and back", "[kernels]") {
  // positions restarting at a document (rows 0-3, then 4-6) turn each document as rope from 0 would
  const int T = 7, C = 8, NH = 2, NKV = 1, C3 = C + 2 * NKV * (C / NH);
  const int pos[T] = {0, 1, 2, 3, 0, 1, 2};
  const auto qkv = randn(T * C3, 1.f, 6);
  std::vector<float> packed = qkv, first(qkv.begin(), qkv.begin() + 4 * C3), second(qkv.begin() + 4 * C3, qkv.end());
  rope_forward(packed.data(), 1, T, C, NH, NKV, 10000.f, 0, pos);
  rope_forward(first.data(), 1, 4, C, NH, NKV, 10000.f, 0, nullptr);
  rope_forward(second.data(), 1, 3, C, NH, NKV, 10000.f, 0, nullptr);
  CHECK(std::vector<float>(packed.begin(), packed.begin() + 4 * C3) == first);
  CHECK(std::vector<float>(packed.begin() + 4 * C3, packed.end()) == second);
  rope_backward(packed.data(), 1, T, C, NH, NKV, 10000.f, 0, pos);  // turned back
  for (int i = 0; i < T * C3; ++i) CHECK(packed[i] == Approx(qkv[i]).margin(1e-6));

  const int V = 3, tokens[T] = {1, 2, 0, 1, 2, 2, 0};
  const auto wte = randn(V * C, 1.f, 7), wpe = randn(T * C, 1.f, 8), dout = randn(T * C, 1.f, 9);
  std::vector<float> out(T * C), dwte(V * C, 0.f), dwpe(T * C, 0.f);
  encoder_forward(out.data(), tokens, wte.data(), wpe.data(), 1, T, C, 0, V, pos);
  encoder_backward(dwte.data(), dwpe.data(), dout.data(), tokens, 1, T, C, 0, V, pos);
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < C; ++c) CHECK(out[t * C + c] == wte[tokens[t] * C + c] + wpe[pos[t] * C + c]);
  for (int c = 0; c < C; ++c) {
    CHECK(dwpe[0 * C + c] == dout[0 * C + c] + dout[4 * C + c]);  // position 0 of both documents
    CHECK(dwpe[3 * C + c] == dout[3 * C + c]);
    CHECK(dwpe[4 * C + c] == 0.f);  // no row is at position 4
  }
}

TEST_CASE("the embedding without a position table and the residual without a bias", "[kernels]") {
  const int B = 1, T = 3, C = 4, V = 5;
  const auto wte = randn(V * C, 1.f, 1);
  const int tokens[T] = {4, 0, 4};
  std::vector<float> out(T * C), dwte(V * C, 0.f), dout = randn(T * C, 1.f, 2);
  encoder_forward(out.data(), tokens, wte.data(), nullptr, B, T, C, 0, V, nullptr);
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < C; ++c) CHECK(out[t * C + c] == wte[tokens[t] * C + c]);
  encoder_backward(dwte.data(), nullptr, dout.data(), tokens, B, T, C, 0, V, nullptr);
  for (int c = 0; c < C; ++c) {
    CHECK(dwte[4 * C + c] == dout[c] + dout[2 * C + c]);  // token 4 twice
    CHECK(dwte[0 * C + c] == dout[C + c]);
    CHECK(dwte[1 * C + c] == 0.f);
  }
  const auto a = randn(T * C, 1.f, 3), b = randn(T * C, 1.f, 4);
  residual_forward(out.data(), a.data(), b.data(), nullptr, T, C);
  for (int i = 0; i < T * C; ++i) CHECK(out[i] == a[i] + b[i]);
}
