// The mixture-of-experts kernels: routing against a brute-force sort of each token's
// probabilities, each forward against its formula written here, each backward against central
// finite differences (gradcheck.hpp). The router's top-k is a choice: its finite differences are
// taken where each token's logits are far apart, so that no step changes what is chosen.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "gradcheck.hpp"
#include "pipetrain/compute/moe_kernels.hpp"

using namespace pipetrain;
using gradcheck::check;
using gradcheck::dot;
using gradcheck::randn;

namespace {

// Logits whose sorted values per token are at least `gap` apart (a random order of 0, gap, 2 gap, ...
// plus a little noise), so a finite-difference step of 1e-2 never changes a token's top k.
std::vector<float> spaced_logits(int N, int E, float gap, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<float> out(static_cast<size_t>(N) * E);
  auto noise = randn(out.size(), 0.05f, seed + 1);
  for (int t = 0; t < N; ++t) {
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), gen);
    for (int e = 0; e < E; ++e) out[t * E + order[e]] = gap * (e - E / 2) + noise[t * E + e];
  }
  return out;
}

}  // namespace

TEST_CASE("moe_route: each token's top k by probability, rows expert after expert in token order", "[moe]") {
  const int N = 13, E = 5, k = 2;
  auto logits = randn(N * E, 1.f, 3);
  std::vector<float> probs(N * E), lse(N);
  router_softmax_forward(probs.data(), lse.data(), logits.data(), N, E);
  for (int t = 0; t < N; ++t) {  // the softmax, in double
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += std::exp(double(logits[t * E + e]));
    CHECK(lse[t] == Approx(std::log(sum)).epsilon(1e-6));
    for (int e = 0; e < E; ++e)
      CHECK(probs[t * E + e] == Approx(std::exp(double(logits[t * E + e])) / sum).epsilon(1e-5));
  }
  for (bool norm : {true, false}) {
    MoeRouting r;
    moe_route(r, probs.data(), N, E, k, norm, moe_capacity(0, N, E, k));
    REQUIRE(r.rows() == N * k);
    CHECK(r.dropped() == 0);
    std::vector<int> chosen(E, 0);
    for (int t = 0; t < N; ++t) {
      std::vector<int> order(E);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return probs[t * E + a] > probs[t * E + b]; });
      const double picked = probs[t * E + order[0]] + probs[t * E + order[1]];
      for (int s = 0; s < k; ++s) {
        CHECK(r.expert[t * k + s] == order[s]);
        const double w = probs[t * E + order[s]] / (norm ? picked : 1.0);
        CHECK(r.weight[t * k + s] == Approx(w).epsilon(1e-6));
        const int row = r.row[t * k + s];
        CHECK(r.token[row] == t);
        CHECK(row >= r.offsets[order[s]]);
        CHECK(row < r.offsets[order[s] + 1]);
        ++chosen[order[s]];
      }
    }
    for (int e = 0; e < E; ++e) {
      CHECK(r.chosen[e] == chosen[e]);
      CHECK(r.offsets[e + 1] - r.offsets[e] == chosen[e]);
      for (int row = r.offsets[e] + 1; row < r.offsets[e + 1]; ++row) CHECK(r.token[row - 1] < r.token[row]);
    }
    CHECK(r.bytes() == moe_routing_bytes(N, k, E));
  }
}

TEST_CASE("moe_route with a capacity keeps each expert's first slots in token order and drops the rest", "[moe]") {
  // Every token prefers expert 0, then 1: with capacity 3, tokens 0-2 keep both, the rest drop them.
  const int N = 6, E = 4, k = 2;
  std::vector<float> probs(N * E);
  for (int t = 0; t < N; ++t) {
    probs[t * E + 0] = 0.5f, probs[t * E + 1] = 0.3f, probs[t * E + 2] = 0.15f, probs[t * E + 3] = 0.05f;
  }
  CHECK(moe_capacity(1.0, N, E, k) == 3);  // ceil(1.0 x 6 x 2 / 4)
  CHECK(moe_capacity(0, N, E, k) == N * k);
  MoeRouting r;
  moe_route(r, probs.data(), N, E, k, true, 3);
  CHECK(r.rows() == 6);
  CHECK(r.dropped() == 6);
  CHECK(r.chosen[0] == 6);  // chosen counts slots before the drop
  for (int t = 0; t < N; ++t)
    for (int s = 0; s < k; ++s) CHECK((r.row[t * k + s] >= 0) == (t < 3));
  // A dropped slot adds nothing to its token's output, and its weight's gradient is 0.
  const int C = 3;
  auto y = randn(r.rows() * C, 1.f, 5), dout = randn(N * C, 1.f, 6);
  std::vector<float> out(N * C), dweight(N * k, 7.f);
  moe_combine_forward(out.data(), y.data(), r, C, false);
  for (int t = 3; t < N; ++t)
    for (int c = 0; c < C; ++c) CHECK(out[t * C + c] == 0.f);
  moe_combine_backward(nullptr, dweight.data(), dout.data(), y.data(), r, C);
  for (int t = 3; t < N; ++t) CHECK(dweight[t * k] == 0.f);
}

TEST_CASE("router_backward: the combine weights' and both losses' gradients match finite differences", "[moe]") {
  const int N = 7, E = 6, k = 2;
  for (bool norm : {true, false}) {
    INFO("norm_topk " << norm);
    auto logits = spaced_logits(N, E, 0.5f, 11);
    auto probe = randn(N * k, 1.f, 12);
    const float aux_scale = 0.7f, z_scale = 0.3f;
    std::vector<float> probs(N * E), lse(N);
    MoeRouting r;
    auto loss = [&] {
      router_softmax_forward(probs.data(), lse.data(), logits.data(), N, E);
      moe_route(r, probs.data(), N, E, k, norm, N * k);
      const RouterLosses l = router_losses(probs.data(), lse.data(), r);
      return dot(r.weight, probe) + aux_scale * l.aux + z_scale * l.z;
    };
    loss();
    std::vector<float> dlogits(N * E);
    router_backward(dlogits.data(), probe.data(), probs.data(), lse.data(), r, norm, aux_scale, z_scale);
    check("dlogits", loss, logits.data(), dlogits.data(), logits.size(), 20);
  }
}

TEST_CASE("router_losses: experts x sum_e f_e P_e and the mean squared logsumexp", "[moe]") {
  const int N = 9, E = 4, k = 2;
  auto logits = randn(N * E, 1.f, 21);
  std::vector<float> probs(N * E), lse(N);
  router_softmax_forward(probs.data(), lse.data(), logits.data(), N, E);
  MoeRouting r;
  moe_route(r, probs.data(), N, E, k, true, N * k);
  double aux = 0, z = 0;
  for (int e = 0; e < E; ++e) {
    double f = 0, P = 0;
    for (int t = 0; t < N; ++t) {
      for (int s = 0; s < k; ++s) f += r.expert[t * k + s] == e;
      P += probs[t * E + e];
    }
    aux += (f / N) * (P / N);
  }
  for (int t = 0; t < N; ++t) z += double(lse[t]) * lse[t];
  const RouterLosses l = router_losses(probs.data(), lse.data(), r);
  CHECK(l.aux == Approx(E * aux).epsilon(1e-6));
  CHECK(l.z == Approx(z / N).epsilon(1e-6));
  // Uniform probabilities, every expert chosen equally often: aux is top_k.
  std::vector<float> uniform(4 * 4, 0.25f), uniform_lse(4, std::log(4.f));
  MoeRouting u;
  u.N = 4, u.k = 2, u.E = 4;
  u.chosen = {2, 2, 2, 2};
  CHECK(router_losses(uniform.data(), uniform_lse.data(), u).aux == Approx(2.0));
}

TEST_CASE("combine, gather and scatter: the weighted sum of a token's rows, and their gradients", "[moe]") {
  const int N = 8, E = 3, k = 2, C = 5;
  auto logits = spaced_logits(N, E, 0.5f, 31);
  std::vector<float> probs(N * E), lse(N);
  router_softmax_forward(probs.data(), lse.data(), logits.data(), N, E);
  MoeRouting r;
  moe_route(r, probs.data(), N, E, k, true, N * k);
  auto y = randn(r.rows() * C, 1.f, 32), probe = randn(N * C, 1.f, 33);
  std::vector<float> out(N * C);
  auto loss = [&] {
    moe_combine_forward(out.data(), y.data(), r, C, false);
    return dot(out, probe);
  };
  loss();
  for (int t = 0; t < N; ++t)
    for (int c = 0; c < C; ++c) {
      double want = 0;
      for (int s = 0; s < k; ++s) want += double(r.weight[t * k + s]) * y[r.row[t * k + s] * C + c];
      CHECK(out[t * C + c] == Approx(want).epsilon(1e-6));
    }
  std::vector<float> dy(r.rows() * C), dweight(N * k);
  moe_combine_backward(dy.data(), dweight.data(), probe.data(), y.data(), r, C);
  check("dy", loss, y.data(), dy.data(), y.size());
  check("dweight", loss, r.weight.data(), dweight.data(), r.weight.size());
  // accumulate adds to what out holds (the shared experts' output)
  loss();  // out at the unperturbed weights
  std::vector<float> base(N * C, 1.f);
  moe_combine_forward(base.data(), y.data(), r, C, true);
  for (int i = 0; i < N * C; ++i) CHECK(base[i] == Approx(out[i] + 1.f).margin(1e-6));
  // gather and scatter-add are each other's transpose: <gather(x), g> = <x, scatter(g)>
  auto x = randn(N * C, 1.f, 34), g = randn(r.rows() * C, 1.f, 35);
  std::vector<float> xs(r.rows() * C), dx(N * C, 0.f);
  moe_gather(xs.data(), x.data(), r, C);
  for (int row = 0; row < r.rows(); ++row)
    for (int c = 0; c < C; ++c) CHECK(xs[row * C + c] == x[r.token[row] * C + c]);
  moe_scatter_add(dx.data(), g.data(), r, C);
  CHECK(dot(xs, g) == Approx(dot(x, dx)).epsilon(1e-5));
}

TEST_CASE("grouped matmul: each expert's rows through its own matrix, and the backward", "[moe]") {
  const int E = 3, C = 4, OC = 6;
  const std::vector<int> offsets = {0, 3, 3, 7};  // expert 1 has no rows
  const int rows = offsets.back();
  auto inp = randn(rows * C, 1.f, 41), w = randn(E * OC * C, 1.f, 42), probe = randn(rows * OC, 1.f, 43);
  std::vector<float> out(rows * OC);
  auto loss = [&] {
    grouped_matmul_forward(kernels(Device::cpu), out.data(), inp.data(), w.data(), offsets.data(), E, C, OC);
    return dot(out, probe);
  };
  loss();
  for (int e = 0; e < E; ++e)
    for (int row = offsets[e]; row < offsets[e + 1]; ++row)
      for (int o = 0; o < OC; ++o) {
        double want = 0;
        for (int c = 0; c < C; ++c) want += double(inp[row * C + c]) * w[(e * OC + o) * C + c];
        CHECK(out[row * OC + o] == Approx(want).epsilon(1e-5));
      }
  std::vector<float> dinp(rows * C), dw(E * OC * C, 0.25f);
  grouped_matmul_backward(kernels(Device::cpu), dinp.data(), dw.data(), probe.data(), inp.data(), w.data(),
                          offsets.data(), E, C, OC);
  for (auto& v : dw) v -= 0.25f;  // accumulated onto what was there
  check("dinp", loss, inp.data(), dinp.data(), inp.size());
  check("dweight", loss, w.data(), dw.data(), w.size());
  for (int i = OC * C; i < 2 * OC * C; ++i) CHECK(dw[i] == 0.f);  // the empty expert's gradient untouched
}
