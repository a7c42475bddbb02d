// Every layer's backward against central finite differences of its forward (see gradcheck.hpp
// for the tolerances). Each test builds loss = sum(out * R) for a random R, so dL/dout = R.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>

#include "gradcheck.hpp"
#include "pipetrain/compute/kernels.hpp"
#include "pipetrain/compute/parallel_for.hpp"

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
  // head size 4: the tiles' plain-loop columns; head size 16 with T = 7: whole vector tiles and a
  // last row tile of 3; grouped key/value heads (2 of 4 query heads each, and multi-query); T = 150:
  // three blocks of queries against three of keys, the last a part block
  for (auto [B, T, C, NH, NKV] :
       {std::array<int, 5>{2, 5, 8, 2, 2}, {1, 7, 32, 2, 2}, {2, 5, 16, 4, 2}, {1, 6, 16, 4, 1}, {1, 150, 32, 4, 2}}) {
    INFO("B " << B << " T " << T << " C " << C << " NH " << NH << " NKV " << NKV);
    const int C3 = C + 2 * NKV * (C / NH);
    auto qkv = randn(B * T * C3, 1.f, 1), r = randn(B * T * C, 1.f, 2);
    std::vector<float> out(B * T * C), lse(B * NH * T);
    auto loss = [&] {
      attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH, NKV, nullptr);
      return dot(out, r);
    };
    loss();
    std::vector<float> dqkv(qkv.size(), 0.5f);  // overwritten, not added to
    attention_backward(dqkv.data(), r.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH, NKV, nullptr);
    check("dqkv", loss, qkv.data(), dqkv.data(), qkv.size(), 40);
  }
}

TEST_CASE("attention backward matches finite differences at T = 4096", "[kernels]") {
  // 64 blocks of queries and of keys; the loss reads 8 rows, the last among them, so that the fp32
  // sum stays short while every key up to row 4095 gets a gradient
  const int B = 1, T = 4096, C = 64, NH = 4, NKV = 2, C3 = C + 2 * NKV * (C / NH);
  auto qkv = randn(static_cast<size_t>(B) * T * C3, 1.f, 3), r = randn(static_cast<size_t>(B) * T * C, 1.f, 4);
  for (int t = 0; t < T; ++t)
    if (t % 613 != 612 && t != T - 1) std::fill_n(r.begin() + static_cast<size_t>(t) * C, C, 0.f);
  std::vector<float> out(r.size()), lse(B * NH * T);
  auto loss = [&] {
    attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH, NKV, nullptr);
    return dot(out, r);
  };
  loss();
  std::vector<float> dqkv(qkv.size(), 0.5f);
  attention_backward(dqkv.data(), r.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH, NKV, nullptr);
  check("dqkv", loss, qkv.data(), dqkv.data(), qkv.size(), 24);
}

namespace {

// Causal attention the plain way, in double: the full T x T scores with the upper triangle masked
// (and, given doc_start [B, T], the keys before each row's document's start), and backward through
// full T x T products; query head h reads key/value head h / (NH / NKV). Fills each row's
// log-sum-exp, out and dqkv like the kernels.
void reference_attention(std::vector<double>& lse, std::vector<double>& out, std::vector<double>& dqkv,
                         const std::vector<float>& qkv, const std::vector<float>& dout, int B, int T, int C, int NH,
                         int NKV, const std::vector<int>& doc_start = {}) {
  const int hs = C / NH, KV = NKV * hs, C3 = C + 2 * KV, group = NH / NKV;
  const double scale = 1 / std::sqrt(static_cast<double>(hs));
  lse.assign(static_cast<size_t>(B) * NH * T, 0);
  out.assign(static_cast<size_t>(B) * T * C, 0);
  dqkv.assign(qkv.size(), 0);
  auto q = [&](int b, int t, int h, int i) { return double(qkv[(b * T + t) * C3 + h * hs + i]); };
  auto k = [&](int b, int t, int h, int i) { return double(qkv[(b * T + t) * C3 + C + h / group * hs + i]); };
  auto v = [&](int b, int t, int h, int i) { return double(qkv[(b * T + t) * C3 + C + KV + h / group * hs + i]); };
  auto d = [&](int b, int t, int h, int i) { return double(dout[(b * T + t) * C + h * hs + i]); };
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      std::vector<double> p(static_cast<size_t>(T) * T, 0), dp(static_cast<size_t>(T) * T, 0);
      for (int t = 0; t < T; ++t) {
        std::vector<double> s(T);
        double mx = -INFINITY, z = 0;
        for (int u = 0; u < T; ++u) {
          s[u] = -INFINITY;  // the mask
          if (u > t || (!doc_start.empty() && u < doc_start[b * T + t])) continue;
          s[u] = 0;
          for (int i = 0; i < hs; ++i) s[u] += scale * q(b, t, h, i) * k(b, u, h, i);
          mx = std::max(mx, s[u]);
        }
        for (int u = 0; u < T; ++u) z += (p[t * T + u] = std::exp(s[u] - mx));
        for (int u = 0; u < T; ++u) p[t * T + u] /= z;
        lse[(static_cast<size_t>(b) * NH + h) * T + t] = mx + std::log(z);
        for (int i = 0; i < hs; ++i)
          for (int u = 0; u < T; ++u) out[(b * T + t) * C + h * hs + i] += p[t * T + u] * v(b, u, h, i);
        // datt = dout v^T over all u, then the softmax's backward (zero where p is)
        double rowdot = 0;
        for (int u = 0; u < T; ++u) {
          for (int i = 0; i < hs; ++i) dp[t * T + u] += d(b, t, h, i) * v(b, u, h, i);
          rowdot += p[t * T + u] * dp[t * T + u];
        }
        for (int u = 0; u < T; ++u) dp[t * T + u] = p[t * T + u] * (dp[t * T + u] - rowdot);
      }
      for (int t = 0; t < T; ++t)
        for (int u = 0; u < T; ++u)
          for (int i = 0; i < hs; ++i) {
            dqkv[(b * T + t) * C3 + h * hs + i] += scale * dp[t * T + u] * k(b, u, h, i);
            dqkv[(b * T + u) * C3 + C + h / group * hs + i] += scale * dp[t * T + u] * q(b, t, h, i);
            dqkv[(b * T + u) * C3 + C + KV + h / group * hs + i] += p[t * T + u] * d(b, t, h, i);
          }
    }
}

// Largest |got - want| relative to the largest |want|: float rounding keeps it below 1e-6 (5e-7 at
// most for these shapes), a wrong or missing block of the triangle makes it O(1).
double max_relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / scale;
}

}  // namespace

TEST_CASE("blocked causal attention matches the full masked T x T computation", "[kernels]") {
  // T around the 4-row and 16-column tiles (1, a part tile, whole tiles, one past) and the 64-row
  // blocks (one block, one past, two whole, two and a part); head sizes with no whole 16-column tile
  // (3), whole tiles (16, 64) and whole tiles plus a rest (40)
  for (int T : {1, 3, 4, 16, 17, 37, 64, 65, 128, 150})
    for (auto [C, NH, NKV] :
         {std::array<int, 3>{6, 2, 2}, {32, 2, 2}, {40, 1, 1}, {128, 2, 2}, {64, 4, 2}, {64, 4, 1}}) {
      const int B = 2, C3 = C + 2 * NKV * (C / NH);
      INFO("T " << T << " C " << C << " NH " << NH << " NKV " << NKV);
      const auto qkv = randn(B * T * C3, 1.f, 11), dout = randn(B * T * C, 1.f, 12);
      std::vector<float> out(dout.size()), lse(B * NH * T, -1.f), dqkv(qkv.size(), -1.f);
      attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH, NKV, nullptr);
      attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH, NKV, nullptr);
      std::vector<double> ref_lse, ref_out, ref_dqkv;
      reference_attention(ref_lse, ref_out, ref_dqkv, qkv, dout, B, T, C, NH, NKV);
      CHECK(max_relative_error(lse, ref_lse) < 2e-6);
      CHECK(max_relative_error(out, ref_out) < 2e-6);
      CHECK(max_relative_error(dqkv, ref_dqkv) < 2e-6);
    }
}

namespace {

// [B, T] document starts: row b's documents begin at starts[b] (0 first), each row's first position
// of its document.
std::vector<int> document_starts(int T, const std::vector<std::vector<int>>& starts) {
  std::vector<int> out;
  for (const auto& row : starts)
    for (int t = 0, d = 0; t < T; ++t) {
      while (d + 1 < static_cast<int>(row.size()) && row[d + 1] <= t) ++d;
      out.push_back(row[d]);
    }
  return out;
}

// Documents of every kind around the 64-row blocks and 16-column tiles: one token long, starting
// on a block's first row, crossing two block edges, ending a sequence; a sequence of one document.
const std::vector<std::vector<int>> kDocuments = {{0, 5, 6, 64, 70, 130, 149}, {0}, {0, 63, 128}};

}  // namespace

TEST_CASE("attention's AVX-512 tiles give the AVX2 tiles' bits", "[kernels]") {
  // Head sizes with a whole 32-column wide tile and a 16-column rest (48), wide tiles alone (64,
  // 128), none (16); T around the 64-row blocks; with and without documents. On a CPU without
  // AVX-512 both runs take the narrow tiles and the check is trivially true.
  const std::vector<int> start = document_starts(150, {{0, 5, 6, 64, 70, 130, 149}});
  for (int T : {17, 64, 150})
    for (auto [C, NH, NKV] : {std::array<int, 3>{96, 2, 2}, {128, 2, 1}, {256, 2, 2}, {32, 2, 2}})
      for (bool documents : {false, true}) {
        INFO("T " << T << " C " << C << " NH " << NH << " NKV " << NKV << " documents " << documents);
        const int C3 = C + 2 * NKV * (C / NH);
        const auto qkv = randn(T * C3, 1.f, 21), dout = randn(T * C, 1.f, 22);
        const int* doc = documents ? start.data() : nullptr;
        std::vector<float> runs[2][3];
        for (bool wide : {true, false}) {
          set_wide_attention_tiles(wide);
          std::vector<float> out(dout.size()), lse(NH * T), dqkv(qkv.size());
          attention_forward(out.data(), lse.data(), qkv.data(), 1, T, C, NH, NKV, doc);
          attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), 1, T, C, NH, NKV, doc);
          runs[wide][0] = out, runs[wide][1] = lse, runs[wide][2] = dqkv;
        }
        set_wide_attention_tiles(true);
        for (int i = 0; i < 3; ++i) CHECK(runs[0][i] == runs[1][i]);
      }
}

TEST_CASE("document-masked attention matches the full T x T computation with the mask", "[kernels]") {
  for (int T : {17, 150})
    for (auto [C, NH, NKV] : {std::array<int, 3>{6, 2, 2}, {64, 4, 2}, {40, 1, 1}}) {
      const int B = 3, C3 = C + 2 * NKV * (C / NH);
      INFO("T " << T << " C " << C << " NH " << NH << " NKV " << NKV);
      std::vector<std::vector<int>> docs;
      for (const auto& row : kDocuments) {
        docs.emplace_back();
        for (int s : row)
          if (s < T) docs.back().push_back(s);
      }
      const auto start = document_starts(T, docs);
      const auto qkv = randn(B * T * C3, 1.f, 21), dout = randn(B * T * C, 1.f, 22);
      std::vector<float> out(dout.size()), lse(B * NH * T, -1.f), dqkv(qkv.size(), -1.f);
      attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH, NKV, start.data());
      attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH, NKV, start.data());
      std::vector<double> ref_lse, ref_out, ref_dqkv;
      reference_attention(ref_lse, ref_out, ref_dqkv, qkv, dout, B, T, C, NH, NKV, start);
      CHECK(max_relative_error(lse, ref_lse) < 2e-6);
      CHECK(max_relative_error(out, ref_out) < 2e-6);
      CHECK(max_relative_error(dqkv, ref_dqkv) < 2e-6);
    }
}

TEST_CASE("a packed sequence's masked attention equals each of its documents' attention alone", "[kernels]") {
  const int T = 150, C = 64, NH = 4, NKV = 2, C3 = C + 2 * NKV * (C / NH);
  const std::vector<int> begins = kDocuments[0];
  const auto start = document_starts(T, {begins});
  const auto qkv = randn(T * C3, 1.f, 23), dout = randn(T * C, 1.f, 24);
  std::vector<float> out(T * C), lse(NH * T), dqkv(qkv.size());
  attention_forward(out.data(), lse.data(), qkv.data(), 1, T, C, NH, NKV, start.data());
  attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), 1, T, C, NH, NKV, start.data());
  for (size_t d = 0; d < begins.size(); ++d) {
    const int s = begins[d], n = (d + 1 < begins.size() ? begins[d + 1] : T) - s;
    INFO("document at " << s << ", " << n << " tokens");
    const std::vector<float> q(qkv.begin() + s * C3, qkv.begin() + (s + n) * C3),
        g(dout.begin() + s * C, dout.begin() + (s + n) * C);
    std::vector<float> o(n * C), l(NH * n), dq(q.size());
    attention_forward(o.data(), l.data(), q.data(), 1, n, C, NH, NKV, nullptr);
    attention_backward(dq.data(), g.data(), q.data(), o.data(), l.data(), 1, n, C, NH, NKV, nullptr);
    auto close = [](const float* packed, const std::vector<float>& alone) {
      double err = 0, scale = 0;
      for (size_t i = 0; i < alone.size(); ++i) {
        err = std::max(err, double(std::abs(packed[i] - alone[i])));
        scale = std::max(scale, double(std::abs(alone[i])));
      }
      return err / scale;
    };
    CHECK(close(out.data() + s * C, o) < 1e-6);
    CHECK(close(dqkv.data() + s * C3, dq) < 1e-6);
    for (int h = 0; h < NH; ++h)
      CHECK(close(lse.data() + h * T + s, std::vector<float>(l.begin() + h * n, l.begin() + (h + 1) * n)) < 1e-6);
  }
}

TEST_CASE("document-masked attention backward matches finite differences", "[kernels]") {
  // At T = 150 the loss reads the rows around the documents' edges and the blocks' (one of them
  // the first row of a document, one the last of a block), so that its fp32 sum stays short
  // enough for the difference quotient in any build (a debug build sums in another order).
  for (auto [T, C, NH, NKV] : {std::array<int, 4>{9, 16, 2, 1}, {150, 32, 4, 2}}) {
    INFO("T " << T);
    const int B = 2, C3 = C + 2 * NKV * (C / NH);
    const auto start = document_starts(T, {{0, 3, 4, T > 64 ? 64 : 7, T > 64 ? 100 : 8}, {0, 2}});
    auto qkv = randn(B * T * C3, 1.f, 25), r = randn(B * T * C, 1.f, 26);
    const std::vector<int> read = {2, 3, 5, 63, 64, 65, 99, 100, 127, 128, 149};
    if (T > 64)
      for (int row = 0; row < B * T; ++row)
        if (std::find(read.begin(), read.end(), row % T) == read.end()) std::fill_n(r.begin() + row * C, C, 0.f);
    std::vector<float> out(B * T * C), lse(B * NH * T);
    auto loss = [&] {
      attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH, NKV, start.data());
      return dot(out, r);
    };
    loss();
    std::vector<float> dqkv(qkv.size(), 0.5f);
    attention_backward(dqkv.data(), r.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH, NKV, start.data());
    check("dqkv", loss, qkv.data(), dqkv.data(), qkv.size(), 40);
  }
}

TEST_CASE("cached attention keeps to each new token's document", "[kernels]") {
  // the sequence run 1, 20, then 29 tokens at a time against the cache equals its masked forward
  const int T = 50, C = 32, NH = 4, NKV = 2, KV = NKV * (C / NH), C3 = C + 2 * KV;
  const auto start = document_starts(T, {{0, 4, 21, 22, 40}});
  const auto qkv = randn(T * C3, 1.f, 27);
  std::vector<float> whole(T * C), lse(NH * T), cached(T * C), k_cache(T * KV), v_cache(T * KV);
  attention_forward(whole.data(), lse.data(), qkv.data(), 1, T, C, NH, NKV, start.data());
  for (auto [pos, n] : {std::array<int, 2>{0, 1}, {1, 20}, {21, 29}})
    attention_forward_cached(cached.data() + pos * C, qkv.data() + pos * C3, k_cache.data(), v_cache.data(), pos, n, C,
                             NH, NKV, start.data() + pos);
  for (int i = 0; i < T * C; ++i) CHECK(cached[i] == Approx(whole[i]).margin(1e-6));
}

TEST_CASE("blocked causal attention matches a naive per-row softmax at T = 4096", "[kernels]") {
  // The forward at the lengths a T x T matrix made too costly: sampled rows of every head (the
  // first, block edges, the last) against the softmax written out in double, within 1e-6
  const int B = 1, T = 4096, NH = 4, hs = 16, C = NH * hs;
  for (const int NKV : {4, 1}) {
    INFO("NKV " << NKV);
    const int C3 = C + 2 * NKV * hs, group = NH / NKV;
    const auto qkv = randn(static_cast<size_t>(T) * C3, 1.f, 13);
    std::vector<float> out(static_cast<size_t>(T) * C), lse(NH * T);
    attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH, NKV, nullptr);
    double worst = 0, largest = 0, worst_lse = 0;
    for (int h = 0; h < NH; ++h)
      for (int t : {0, 63, 64, 1000, 2047, 2048, 4031, 4095}) {
        const float* q = qkv.data() + static_cast<size_t>(t) * C3 + h * hs;
        const float* k = qkv.data() + C + h / group * hs;
        const float* v = k + NKV * hs;
        std::vector<double> s(t + 1);
        double mx = -INFINITY, z = 0;
        for (int u = 0; u <= t; ++u) {
          s[u] = 0;
          for (int i = 0; i < hs; ++i) s[u] += double(q[i]) * k[static_cast<size_t>(u) * C3 + i];
          mx = std::max(mx, s[u] /= std::sqrt(double(hs)));
        }
        for (auto& e : s) z += (e = std::exp(e - mx));
        worst_lse = std::max(worst_lse, std::abs(lse[h * T + t] - (mx + std::log(z))) / std::abs(mx + std::log(z)));
        for (int i = 0; i < hs; ++i) {
          double o = 0;
          for (int u = 0; u <= t; ++u) o += s[u] / z * v[static_cast<size_t>(u) * C3 + i];
          worst = std::max(worst, std::abs(out[static_cast<size_t>(t) * C + h * hs + i] - o));
          largest = std::max(largest, std::abs(o));
        }
      }
    CHECK(worst / largest < 1e-6);
    CHECK(worst_lse < 1e-6);
  }
}

TEST_CASE("blocked causal attention gives the same bits on 1 and 2 threads", "[kernels][parallel]") {
  const int B = 3, C = 40, NH = 2;  // part tiles in both directions: head size 20; part blocks at 150
  for (const int T : {37, 150})
    for (const int NKV : {2, 1}) {
      const int C3 = C + 2 * NKV * (C / NH);
      const auto qkv = randn(B * T * C3, 1.f, 21), dout = randn(B * T * C, 1.f, 22);
      auto run = [&](int threads) {
        set_parallel_threads(threads);
        std::vector<float> out(dout.size()), lse(B * NH * T), dqkv(qkv.size());
        attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH, NKV, nullptr);
        attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH, NKV, nullptr);
        set_parallel_threads(1);
        return std::vector<std::vector<float>>{out, lse, dqkv};
      };
      CHECK(run(1) == run(2));
    }
}

TEST_CASE("a head's attention has the same bits whichever batch and heads run beside it", "[kernels]") {
  // A tensor rank holds some of the heads (with their key/value heads) and data-parallel ranks
  // other samples: each head's rows must come out the same bits as on one rank with all of them.
  const int T = 150, hs = 8, NH = 4, NKV = 2, C = NH * hs, C3 = C + 2 * NKV * hs, B = 2;
  const auto qkv = randn(B * T * C3, 1.f, 31), dout = randn(B * T * C, 1.f, 32);
  std::vector<float> out(dout.size()), lse(B * NH * T), dqkv(qkv.size());
  attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH, NKV, nullptr);
  attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH, NKV, nullptr);
  // sample 1, query heads 2 and 3 with key/value head 1: what tp 2 x dp 2 gives one rank
  const int c = 2 * hs, c3 = c + 2 * hs;
  std::vector<float> part(T * c3), dpart(T * c), pout(T * c), plse(2 * T), pd(T * c3);
  for (int t = 0; t < T; ++t) {
    const float* row = qkv.data() + static_cast<size_t>(T + t) * C3;
    std::copy_n(row + 2 * hs, c, part.data() + t * c3);
    std::copy_n(row + C + hs, hs, part.data() + t * c3 + c);
    std::copy_n(row + C + NKV * hs + hs, hs, part.data() + t * c3 + c + hs);
    std::copy_n(dout.data() + static_cast<size_t>(T + t) * C + 2 * hs, c, dpart.data() + t * c);
  }
  attention_forward(pout.data(), plse.data(), part.data(), 1, T, c, 2, 1, nullptr);
  attention_backward(pd.data(), dpart.data(), part.data(), pout.data(), plse.data(), 1, T, c, 2, 1, nullptr);
  bool same = true;
  for (int t = 0; t < T; ++t) {
    const size_t r = static_cast<size_t>(T + t);
    same = same && std::equal(pout.begin() + t * c, pout.begin() + (t + 1) * c, out.begin() + r * C + 2 * hs);
    same = same && std::equal(pd.begin() + t * c3, pd.begin() + t * c3 + c, dqkv.begin() + r * C3 + 2 * hs);
    same = same && std::equal(pd.begin() + t * c3 + c, pd.begin() + t * c3 + c + hs, dqkv.begin() + r * C3 + C + hs);
    same = same && lse[(NH + 2) * T + t] == plse[t] && lse[(NH + 3) * T + t] == plse[T + t];
  }
  CHECK(same);
}

TEST_CASE("attention is causal and matches a naive per-head reference", "[kernels]") {
  // Every head its own key/value head, pairs of query heads sharing one (grouped-query), and all
  // four sharing one (multi-query): qkv's rows hold the NH query heads, then NKV key heads, then
  // NKV value heads, and query head h reads key/value head h / (NH / NKV).
  const int B = 1, T = 4, NH = 4, hs = 3, C = NH * hs;
  for (const int NKV : {4, 2, 1}) {
    INFO("NKV " << NKV);
    const int C3 = C + 2 * NKV * hs, group = NH / NKV;
    auto qkv = randn(B * T * C3, 1.f, 7);
    std::vector<float> out(B * T * C), lse(B * NH * T);
    attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH, NKV, nullptr);
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const float* k = qkv.data() + C + h / group * hs;             // row u at k[u * C3 + i]
        const float* v = qkv.data() + C + NKV * hs + h / group * hs;  // row u at v[u * C3 + i]
        // naive: softmax over u <= t of q_t . k_u / sqrt(hs), then sum of p_u v_u
        std::vector<double> p(t + 1);
        double mx = -1e30, z = 0;
        for (int u = 0; u <= t; ++u) {
          double s = 0;
          for (int i = 0; i < hs; ++i) s += qkv[t * C3 + h * hs + i] * k[u * C3 + i];
          p[u] = s / std::sqrt(static_cast<double>(hs));
          mx = std::max(mx, p[u]);
        }
        for (auto& e : p) z += (e = std::exp(e - mx));
        for (int i = 0; i < hs; ++i) {
          double o = 0;
          for (int u = 0; u <= t; ++u) o += p[u] / z * v[u * C3 + i];
          CHECK(out[t * C + h * hs + i] == Approx(o).epsilon(1e-5).margin(1e-6));
        }
        CHECK(lse[h * T + t] == Approx(mx + std::log(z)).epsilon(1e-6));
      }
  }
}

TEST_CASE("bias + gelu backward matches finite differences and the tanh formula", "[kernels]") {
  const int N = 5, C = 10;
  auto x = randn(N * C, 2.f, 1), r = randn(N * C, 1.f, 2), bias = randn(C, 0.5f, 5);
  std::vector<float> out(N * C);
  auto loss = [&] {
    bias_gelu_forward(out.data(), x.data(), bias.data(), N, C);
    return dot(out, r);
  };
  loss();
  std::vector<float> dx(N * C, 0.5f), dbias(C, 0.f);  // dx overwritten, dbias added to
  bias_gelu_backward(dx.data(), dbias.data(), x.data(), bias.data(), r.data(), N, C);
  check("dinp", loss, x.data(), dx.data(), x.size(), 50);
  check("dbias", loss, bias.data(), dbias.data(), bias.size(), 50);
  const double x0 = 1.3;
  const double ref = 0.5 * x0 * (1 + std::tanh(std::sqrt(2 / M_PI) * (x0 + 0.044715 * x0 * x0 * x0)));
  float in = static_cast<float>(x0), o;
  gelu_forward(&o, &in, 1);
  CHECK(o == Approx(ref).epsilon(1e-6));
}

TEST_CASE("the fused GELU backward sums the bias gradient as the product's bias_backward does", "[kernels]") {
  // Rows enough for several of reduce_row_chunks' chunks: the sums' order is the chunks'.
  const int N = 300, C = 96;
  const auto x = randn(N * C, 2.f, 3), dout = randn(N * C, 1.f, 4), bias = randn(C, 1.f, 5);
  std::vector<float> alone(N * C), fused(N * C), db_alone(C, 0.25f), db_fused(C, 0.25f);  // added to
  bias_gelu_backward(alone.data(), nullptr, x.data(), bias.data(), dout.data(), N, C);
  bias_backward(db_alone.data(), alone.data(), N, C);
  bias_gelu_backward(fused.data(), db_fused.data(), x.data(), bias.data(), dout.data(), N, C);
  CHECK(fused == alone);
  CHECK(db_fused == db_alone);
  for (int c = 0; c < C; ++c) {  // and it is the column sum, in double
    double sum = 0.25;
    for (int i = 0; i < N; ++i) sum += alone[static_cast<size_t>(i) * C + c];
    CHECK(db_fused[c] == Approx(sum).margin(1e-4));
  }
}

TEST_CASE("fast_tanh stays within 1e-6 of std::tanh everywhere", "[kernels]") {
  double worst = 0;
  for (float x = -20.f; x <= 20.f; x += 1e-3f)
    worst = std::max(worst, std::abs(double(fast_tanh(x)) - std::tanh(double(x))));
  CHECK(worst < 1e-6);
  CHECK(fast_tanh(0.f) == 0.f);
  CHECK(fast_tanh(100.f) == Approx(1.0).margin(1e-7));
}

TEST_CASE("fused bias + GELU and bias + residual equal the unfused kernels", "[kernels]") {
  const int N = 9, C = 5;
  const auto pre = randn(N * C, 1.f, 1), bias = randn(C, 1.f, 2), a = randn(N * C, 1.f, 3), b = randn(N * C, 1.f, 4);
  std::vector<float> with_bias(pre), expected(N * C), out(N * C);
  for (int i = 0; i < N; ++i)
    for (int c = 0; c < C; ++c) with_bias[i * C + c] += bias[c];
  gelu_forward(expected.data(), with_bias.data(), expected.size());
  bias_gelu_forward(out.data(), pre.data(), bias.data(), N, C);
  CHECK(out == expected);
  // and the backward's slope is the unbiased sum's: the bias added again, as the forward added it
  const auto dout = randn(N * C, 1.f, 5);
  const std::vector<float> no_bias(C, 0.f);
  std::vector<float> d_biased(N * C), d_summed(N * C);
  bias_gelu_backward(d_biased.data(), nullptr, pre.data(), bias.data(), dout.data(), N, C);
  bias_gelu_backward(d_summed.data(), nullptr, with_bias.data(), no_bias.data(), dout.data(), N, C);
  CHECK(d_biased == d_summed);
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
    encoder_forward(out.data(), tokens, wte.data(), wpe.data(), B, T, C, 0, V, nullptr);
    return dot(out, r);
  };
  loss();
  std::vector<float> dwte(V * C, 0.f), dwpe(T * C, 0.f);
  encoder_backward(dwte.data(), dwpe.data(), r.data(), tokens, B, T, C, 0, V, nullptr);
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
  softmax_crossentropy_backward(dlogits.data(), probs.data(), targets, 1.f / N, N, V, 0);
  check("dlogits", loss, logits.data(), dlogits.data(), logits.size(), 36);
  // uniform logits: loss = log V exactly
  std::vector<float> zeros(N * V, 0.f);
  CHECK(softmax_crossentropy_forward(probs.data(), zeros.data(), targets, N, V) / N == Approx(std::log(9.0)));
  CHECK(l > 0);
}
