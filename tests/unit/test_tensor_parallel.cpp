// Tensor parallelism's pieces that need no MPI: which part of each whole tensor a tensor rank
// holds (the parts of all ranks tile the whole exactly once, in the layout the layers read), the
// embedding and the loss over a split vocabulary against the whole-vocabulary kernels, and where
// the tensor ranks sit in the world. The layers' collectives are exercised under MPI by
// tests/integration/test_tensor_parallel.py.
#include <catch2/catch.hpp>

#include <cmath>
#include <numeric>
#include <set>

#include "gradcheck.hpp"
#include "pipetrain/compute/kernels.hpp"
#include "pipetrain/dist/topology.hpp"
#include "pipetrain/model/model.hpp"

using namespace pipetrain;
using gradcheck::randn;

namespace {

RunSpec spec_of(std::vector<std::string> sets) { return load_spec("", sets, 0); }

// Every element of the whole tensor, the index of the (rank, local element) that holds it.
void check_tiling(const std::vector<ParamTensor>& whole, const std::vector<std::vector<ParamTensor>>& parts) {
  for (size_t i = 0; i < whole.size(); ++i) {
    const ParamTensor& w = whole[i];
    INFO(w.name);
    std::vector<float> values(w.size);
    std::iota(values.begin(), values.end(), 0.f);
    std::vector<int> held(w.size, 0);
    for (const auto& rank : parts) {
      const ParamTensor& p = rank[i];
      REQUIRE(p.name == w.name);
      CHECK(p.tp.whole == w.shape);
      std::vector<float> mine(p.size);
      take_part(p.tp, p.shape, values.data(), mine.data());
      for (const ElementRun& r : whole_runs(p.tp, p.shape, 0, p.size))
        for (size_t k = 0; k < r.count; ++k) {
          CHECK(mine[r.local + k] == values[r.whole + k]);  // the runs say where take_part took from
          held[r.whole + k] += 1;
        }
    }
    // held by every rank (whole), by one, or by the ranks sharing a key/value head; counted once
    const int copies = parts.front()[i].tp.replica.size;
    CHECK(copies == (parts.front()[i].split() ? copies : static_cast<int>(parts.size())));
    CHECK(std::count(held.begin(), held.end(), copies) == static_cast<long>(w.size));
    CHECK(std::count_if(parts.begin(), parts.end(), [&](const auto& rank) { return rank[i].tp.counted(); }) ==
          static_cast<long>(parts.size()) / copies);
  }
}

}  // namespace

TEST_CASE("tensor ranks' parts tile every whole tensor once, replicated ones whole on each", "[tensor_parallel]") {
  for (const char* arch : {"gpt2", "llama"})
    for (int tp : {2, 4}) {
      INFO(arch << " tp " << tp);
      // vocab 250 does not divide by 4: the vocabulary's rows are split as evenly as they go
      const RunSpec spec = spec_of(
          {std::string("model.arch=") + arch, "model.n_head=4", "model.vocab=250", "model.tie_embeddings=false"});
      const auto whole = stage_params(spec, 0, 1, 0, 2);
      std::vector<std::vector<ParamTensor>> parts;
      for (int r = 0; r < tp; ++r) parts.push_back(stage_params(spec, 0, 1, 0, 2, TpPart{r, tp}));
      check_tiling(whole, parts);
      for (const ParamTensor& p : parts[0]) {
        const bool norm = p.name.find("ln") != std::string::npos || p.name.find("layernorm") != std::string::npos;
        if (norm || p.name == "wpe.weight" || p.name.find("c_proj.bias") != std::string::npos)
          CHECK_FALSE(p.split());  // norms, positions and the output products' biases stay whole
        else CHECK(p.split());
      }
    }
}

TEST_CASE("expert ranks' parts, split again by tensor ranks, tile every expert tensor once", "[tensor_parallel]") {
  const RunSpec spec = spec_of({"model.arch=llama", "model.n_head=4", "model.moe.experts=4", "model.moe.ffn_hidden=8",
                                "model.moe.shared_experts=1"});
  const auto whole = stage_params(spec, 0, 1, 0, 2);
  for (int ep : {2, 4})
    for (int tp : {1, 2}) {
      INFO("ep " << ep << " tp " << tp);
      std::vector<std::vector<ParamTensor>> parts;
      for (int e = 0; e < ep; ++e)
        for (int r = 0; r < tp; ++r) parts.push_back(stage_params(spec, 0, 1, 0, 2, TpPart{r, tp}, TpPart{e, ep}));
      for (size_t i = 0; i < whole.size(); ++i) {
        const ParamTensor& w = whole[i];
        INFO(w.name);
        const bool expert = w.name.find("mlp.experts.") != std::string::npos;
        std::vector<float> values(w.size);
        std::iota(values.begin(), values.end(), 0.f);
        std::vector<int> held(w.size, 0);
        for (const auto& rank : parts) {
          const ParamTensor& p = rank[i];
          CHECK(p.expert == expert);  // the router and the shared experts stay on every expert rank
          CHECK(p.tp.whole == w.shape);
          std::vector<float> mine(p.size);
          take_part(p.tp, p.shape, values.data(), mine.data());
          for (const ElementRun& r : whole_runs(p.tp, p.shape, 0, p.size))
            for (size_t k = 0; k < r.count; ++k) {
              CHECK(mine[r.local + k] == values[r.whole + k]);
              held[r.whole + k] += 1;
            }
          if (expert) CHECK(p.size * ep * tp == w.size);
        }
        // An expert element on one rank of all; anything else on each expert rank as tp holds it.
        const int copies = expert ? 1 : ep * (parts.front()[i].tp.axis < 0 ? tp : 1);
        CHECK(std::count(held.begin(), held.end(), copies) == static_cast<long>(w.size));
      }
    }
}

TEST_CASE("with fewer key/value heads than tensor ranks each rank holds the one its query heads use",
          "[tensor_parallel]") {
  for (int kv_heads : {1, 2}) {
    INFO(kv_heads << " key/value heads, tp 4");
    const int tp = 4, head_dim = 16;
    const RunSpec spec = spec_of({"model.arch=llama", "model.n_head=4", "model.n_kv_head=" + std::to_string(kv_heads)});
    const BlockShape part = tensor_part(block_shape(spec), tp);
    CHECK((part.NH == 1 && part.NKV == 1 && part.kv == head_dim && part.qkv == 3 * head_dim));
    const auto whole = stage_params(spec, 0, 1, 0, 2);
    std::vector<std::vector<ParamTensor>> parts;
    for (int r = 0; r < tp; ++r) parts.push_back(stage_params(spec, 0, 1, 0, 2, TpPart{r, tp}));
    check_tiling(whole, parts);  // each head held by tp / kv_heads ranks, counted on the first
    for (int r = 0; r < tp; ++r) {
      const auto k = std::find_if(parts[r].begin(), parts[r].end(),
                                  [](auto& p) { return p.name == "h.0.self_attn.k_proj.weight"; });
      REQUIRE(k != parts[r].end());
      // query head r attends with key/value head r / (n_head / n_kv_head): its head_dim rows
      const size_t head = static_cast<size_t>(r * kv_heads / tp);
      CHECK(whole_runs(k->tp, k->shape, 0, k->size).front().whole == head * head_dim * spec.model.d_model);
      CHECK((k->tp.shared() == (kv_heads < tp) && k->tp.counted() == (r % (tp / kv_heads) == 0)));
    }
  }
  // Neither dividing the key/value heads nor a multiple of them: refused, naming the key.
  CHECK_THROWS_WITH(
      spec_of({"model.arch=llama", "model.d_model=72", "model.n_head=6", "model.n_kv_head=3", "parallel.tp=2"}),
      Catch::Contains("parallel.tp: tp = 2 neither divides model.n_kv_head = 3 nor is a multiple of it"));
}

TEST_CASE("a packed q/k/v split keeps each rank's heads of q, of k and of v", "[tensor_parallel]") {
  // gpt2's c_attn [3C, C]: rank r holds rows r of each of q, k, v, one after another, which is
  // the packed [q | k | v] of its own heads that the attention kernel reads.
  const int C = 4;
  const BlockShape whole = gpt2_block_shape(C);
  TpSlice s{{3 * C, C}, 0, split_groups(Dim::qkv, whole), TpPart{1, 2}, {}};
  std::vector<float> all(3 * C * C);
  std::iota(all.begin(), all.end(), 0.f);
  std::vector<float> part(3 * C / 2 * C);
  take_part(s, {3 * C / 2, C}, all.data(), part.data());
  const int rows[] = {2, 3, 6, 7, 10, 11};  // q rows 2-3, k rows 4+2.., v rows 8+2..
  for (int i = 0; i < 6; ++i)
    for (int c = 0; c < C; ++c) CHECK(part[i * C + c] == all[rows[i] * C + c]);
  // A row-parallel product's columns: rank 1 of 2 holds columns 2-3 of every row.
  TpSlice cols{{C, C}, 1, {C}, TpPart{1, 2}, {}};
  const auto runs = whole_runs(cols, {C, C / 2}, 0, C * C / 2);
  REQUIRE(runs.size() == static_cast<size_t>(C));
  for (int i = 0; i < C; ++i) CHECK((runs[i].whole == static_cast<size_t>(i * C + 2) && runs[i].count == 2));
}

TEST_CASE("the embedding and the loss over a split vocabulary equal the whole vocabulary's", "[tensor_parallel]") {
  const int B = 2, T = 3, C = 4, V = 7, N = B * T;
  const int tokens[N] = {0, 6, 3, 3, 5, 1};
  const int parts[][2] = {{0, 3}, {3, 7}};  // rows [begin, end) of two tensor ranks
  auto wte = randn(V * C, 1.f, 1), wpe = randn(T * C, 1.f, 2), logits = randn(N * V, 2.f, 3);
  std::vector<float> out(N * C), sum(N * C, 0.f), part(N * C);
  encoder_forward(out.data(), tokens, wte.data(), wpe.data(), B, T, C, 0, V, nullptr);
  for (int r = 0; r < 2; ++r) {  // the first rank adds the positions; the group sums
    encoder_forward(part.data(), tokens, wte.data() + parts[r][0] * C, r == 0 ? wpe.data() : nullptr, B, T, C,
                    parts[r][0], parts[r][1] - parts[r][0], nullptr);
    for (int i = 0; i < N * C; ++i) sum[i] += part[i];
  }
  for (int i = 0; i < N * C; ++i) CHECK(sum[i] == out[i]);  // adding zeros is exact

  std::vector<float> probs(N * V), dlogits(N * V);
  const double loss = softmax_crossentropy_forward(probs.data(), logits.data(), tokens, N, V);
  softmax_crossentropy_backward(dlogits.data(), probs.data(), tokens, 0.5f, N, V, 0);
  // Each rank's logits are its columns; the passes reduce between them as the tensor group does.
  std::vector<std::vector<float>> lg(2), pr(2);
  std::vector<float> row_max(N, -INFINITY), m(N);
  std::vector<double> stats(2 * N, 0.0), st(2 * N);
  for (int r = 0; r < 2; ++r) {
    const int w = parts[r][1] - parts[r][0];
    for (int i = 0; i < N; ++i)
      lg[r].insert(lg[r].end(), logits.begin() + i * V + parts[r][0], logits.begin() + i * V + parts[r][1]);
    vocab_softmax_max(m.data(), lg[r].data(), N, w);
    for (int i = 0; i < N; ++i) row_max[i] = std::max(row_max[i], m[i]);
  }
  for (int r = 0; r < 2; ++r) {
    const int w = parts[r][1] - parts[r][0];
    pr[r].resize(N * w);
    vocab_softmax_exp(pr[r].data(), st.data(), lg[r].data(), row_max.data(), tokens, N, w, parts[r][0]);
    for (int i = 0; i < 2 * N; ++i) stats[i] += st[i];
  }
  for (int r = 0; r < 2; ++r) {
    const int w = parts[r][1] - parts[r][0];
    const double split_loss = vocab_softmax_finish(pr[r].data(), row_max.data(), stats.data(), N, w);
    CHECK(split_loss == Approx(loss).epsilon(1e-12));  // every rank finds the whole loss
    std::vector<float> d(N * w);
    softmax_crossentropy_backward(d.data(), pr[r].data(), tokens, 0.5f, N, w, parts[r][0]);
    for (int i = 0; i < N; ++i)
      for (int j = 0; j < w; ++j) {
        CHECK(pr[r][i * w + j] == Approx(probs[i * V + parts[r][0] + j]).epsilon(1e-6));
        CHECK(d[i * w + j] == Approx(dlogits[i * V + parts[r][0] + j]).margin(1e-7));
      }
  }
}

TEST_CASE("tensor ranks are consecutive world ranks, under either rank order", "[tensor_parallel]") {
  for (RankOrder order : {RankOrder::pp, RankOrder::dp})
    for (int tp : {1, 2, 3}) {
      const int P = 2, D = 3;
      std::set<std::tuple<int, int, int>> seen;
      for (int r = 0; r < tp * P * D; ++r) {
        const Topology t = Topology::of(r, P, D, order, false, tp);
        CHECK(t.tp_rank == r % tp);
        CHECK(t.rank_of(t.stage, t.dp_rank) == r);  // a bijection
        CHECK(t.rank_of(t.stage, t.dp_rank, 0) == r - t.tp_rank);
        seen.insert({t.stage, t.dp_rank, t.tp_rank});
      }
      CHECK(seen.size() == static_cast<size_t>(tp * P * D));
    }
  const std::string map = node_map(nodes_filled_in_order(8, 4), Topology::of(0, 2, 2, RankOrder::pp, false, 2));
  CHECK_THAT(map, Catch::Contains("node0: s0/d0/t0 s0/d0/t1 s1/d0/t0 s1/d0/t1"));
  CHECK_THAT(map, Catch::Contains("tensor groups spanning nodes: 0 of 4"));
}
