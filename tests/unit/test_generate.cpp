// Next-token sampling: the inverse CDF over temperature-scaled, top-k-filtered probabilities.
#include <catch2/catch.hpp>

#include <vector>

#include "pipetrain/tools/generate.hpp"

using namespace pipetrain;

TEST_CASE("sample_token: inverse CDF in token order, temperature and top-k", "[generate]") {
  const std::vector<float> p = {0.1f, 0.2f, 0.3f, 0.4f};
  CHECK(sample_token(p.data(), 4, 1.0, 0, 0.05) == 0);  // cumulative 0.1, 0.3, 0.6, 1.0
  CHECK(sample_token(p.data(), 4, 1.0, 0, 0.25) == 1);
  CHECK(sample_token(p.data(), 4, 1.0, 0, 0.59) == 2);
  CHECK(sample_token(p.data(), 4, 1.0, 0, 0.999999) == 3);
  CHECK(sample_token(p.data(), 4, 0.0, 0, 0.0) == 3);  // greedy
  // top-2 keeps 0.3 and 0.4: renormalised 3/7, 4/7
  CHECK(sample_token(p.data(), 4, 1.0, 2, 0.42) == 2);
  CHECK(sample_token(p.data(), 4, 1.0, 2, 0.43) == 3);
  // a tiny temperature is nearly greedy, not a collapse to token 0 (p^(1/T) underflows for all)
  CHECK(sample_token(p.data(), 4, 1e-4, 0, 0.5) == 3);
  // a high temperature flattens: T = 1e6 is close to uniform
  CHECK(sample_token(p.data(), 4, 1e6, 0, 0.26) == 1);
  // zero-probability tokens are never drawn
  const std::vector<float> q = {0.f, 1.f, 0.f};
  for (double u : {0.0, 0.5, 0.9999}) CHECK(sample_token(q.data(), 3, 1.0, 0, u) == 1);
}
