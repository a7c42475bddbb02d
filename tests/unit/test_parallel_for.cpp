// parallel_for runs every chunk exactly once, and the kernels built on it give the same bits on
// any thread count (the chunks, and so the order of every sum, depend only on the sizes).
#include <catch2/catch.hpp>

#include <atomic>
#include <vector>

#include "gradcheck.hpp"
#include "pipetrain/compute/kernels.hpp"
#include "pipetrain/compute/parallel_for.hpp"

using namespace pipetrain;
using gradcheck::randn;

namespace {
// Restores one thread when a test ends, so other tests run inline as before.
struct Threads {
  explicit Threads(int n) { set_parallel_threads(n); }
  ~Threads() { set_parallel_threads(1); }
};
}  // namespace

TEST_CASE("parallel_for visits every index once, in chunks of grain", "[parallel]") {
  for (int threads : {1, 2, 4}) {
    Threads t(threads);
    for (size_t n : {0, 1, 7, 1000})
      for (size_t grain : {1, 3, 64}) {
        std::vector<std::atomic<int>> seen(n);
        std::atomic<int> bad_chunks{0};
        parallel_for(n, grain, [&](size_t begin, size_t end) {
          if (begin % grain != 0 || end - begin > grain || end > n) ++bad_chunks;
          for (size_t i = begin; i < end; ++i) ++seen[i];
        });
        INFO("threads " << threads << " n " << n << " grain " << grain);
        CHECK(bad_chunks == 0);
        for (size_t i = 0; i < n; ++i) REQUIRE(seen[i] == 1);
      }
  }
}

TEST_CASE("parallel_for survives many short calls back to back", "[parallel]") {
  Threads t(3);
  long total = 0;
  for (int call = 0; call < 5000; ++call) {
    std::vector<int> out(17, 0);
    parallel_for(out.size(), 2, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) out[i] = call;
    });
    for (int v : out) total += v == call;
  }
  CHECK(total == 5000L * 17);
}

TEST_CASE("kernels give identical bits on 1, 2 and 3 threads", "[parallel][kernels]") {
  // Big enough for many chunks in every kernel (rows_per_chunk is 16384 / C).
  const int B = 3, T = 40, C = 64, NH = 4, N = B * T, V = 50;
  const auto x = randn(static_cast<size_t>(N) * C, 1.f, 1), w = randn(C, 1.f, 2), bias = randn(C, 1.f, 3);
  const auto dout = randn(static_cast<size_t>(N) * C, 1.f, 4), qkv = randn(3 * static_cast<size_t>(N) * C, 1.f, 5);
  const auto wide = randn(static_cast<size_t>(N) * 4 * C, 1.f, 6), logits = randn(static_cast<size_t>(N) * V, 2.f, 7);
  std::vector<int> targets(N);
  for (int i = 0; i < N; ++i) targets[i] = (i * 7) % V;

  auto run = [&](int threads) {
    Threads t(threads);
    std::vector<float> out(x.size()), mean(N), rstd(N), dx(x.size(), 0.f), dw(C, 0.f), db(C, 0.f);
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), bias.data(), N, C);
    layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(), rstd.data(), N,
                       C);
    std::vector<float> lse(static_cast<size_t>(B) * NH * T), atty(x.size()), dqkv(qkv.size());
    attention_forward(atty.data(), lse.data(), qkv.data(), B, T, C, NH, NH, nullptr);
    attention_backward(dqkv.data(), dout.data(), qkv.data(), atty.data(), lse.data(), B, T, C, NH, NH, nullptr);
    std::vector<float> g(wide.size()), dg(wide.size()), dbias(4 * C, 0.f), dwm(4 * C * C, 0.f), dinp(x.size());
    gelu_forward(g.data(), wide.data(), wide.size());
    bias_gelu_backward(dg.data(), dbias.data(), wide.data(), g.data(), g.data(), N, 4 * C);
    matmul_backward(dinp.data(), dwm.data(), dbias.data(), wide.data(), x.data(), g.data(), N, C, 4 * C);
    std::vector<float> probs(logits.size());
    const double loss = softmax_crossentropy_forward(probs.data(), logits.data(), targets.data(), N, V);
    std::vector<std::vector<float>> all = {out,  mean, rstd, dx,    dw,  db,   lse,  atty,
                                           dqkv, g,    dg,   dbias, dwm, dinp, probs};
    all.push_back({static_cast<float>(loss), static_cast<float>(loss - static_cast<float>(loss))});
    return all;
  };
  const auto one = run(1);
  for (int threads : {2, 3}) {
    const auto many = run(threads);
    for (size_t k = 0; k < one.size(); ++k) {
      INFO("threads " << threads << ", output " << k);
      CHECK(many[k] == one[k]);
    }
  }
}
