// A Stage of MoE blocks (model.moe): every parameter's gradient against finite differences of the
// whole objective (the loss plus the router's load-balancing and z losses), the split backward and
// the recompute modes against the fused backward, tensor ranks against one rank, and the routing
// figures a stage reports.
#include <catch2/catch.hpp>

#include <random>

#include "gradcheck.hpp"
#include "pipetrain/model/model.hpp"
#include "thread_tensor_group.hpp"

using namespace pipetrain;
using gradcheck::randn;

namespace {

// gate: the shared experts Qwen-MoE's way, their own width and a sigmoid gate on their output.
RunSpec moe_spec(int experts, int top_k, int shared, int every, bool norm_topk, bool gate = false) {
  RunSpec s;
  s.model.arch = Arch::llama;
  s.model.n_layer = 2;
  s.model.d_model = 8;
  s.model.n_head = 2;
  s.model.n_kv_head = 1;
  s.model.seq_len = 4;
  s.model.vocab = 11;
  s.model.ffn_hidden = 12;
  s.model.moe.experts = experts;
  s.model.moe.top_k = top_k;
  s.model.moe.ffn_hidden = 6;
  s.model.moe.shared_experts = shared;
  s.model.moe.every = every;
  s.model.moe.norm_topk = norm_topk;
  s.model.moe.shared_gate = gate;
  s.model.moe.shared_ffn_hidden = gate ? 10 : 0;
  s.model.moe.aux_loss = 0.05;
  s.model.moe.z_loss = 0.02;
  s.train.global_batch = 2;
  s.parallel.micro_batches = 1;
  return s;
}

std::vector<int> random_tokens(size_t n, int vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int> t(n);
  for (auto& v : t) v = static_cast<int>(gen() % vocab);
  return t;
}

void perturb(Stage& st, uint32_t seed) {
  auto noise = randn(st.weights().host().size(), 0.3f, seed);
  for (size_t i = 0; i < noise.size(); ++i) st.weights().host()[i] += noise[i];
}

// The objective a backward differentiates: the mean token loss, plus each MoE block's router
// losses times their coefficients (one micro-batch: dLoss/d(its router loss) is 1).
double objective(Stage& st, const RunSpec& spec, double token_loss, int N) {
  double sum = token_loss / N;
  for (const auto& [block, f] : st.take_moe_figures())
    sum += spec.model.moe.aux_loss * f.aux_loss + spec.model.moe.z_loss * f.z_loss;
  return sum;
}

}  // namespace

TEST_CASE("MoE stage: every parameter's gradient matches finite differences of loss and router losses", "[moe]") {
  struct Case {
    int experts, top_k, shared, every;
    bool norm, gate, qk;
  };
  // Every expert chosen; two of four, renormalised or not, with a shared expert (gated, Qwen-MoE's,
  // or not), and an MoE block beside a dense one; q and k normalised over their heads (OLMoE's). Steps of 1e-3: a
  // token's choice of experts is a step function of the weights, and larger steps (1e-2) change some (the differences
  // then fail where the analytic gradient, which holds the choice, is right; they pass at 1e-3 for every seed tried).
  for (const Case& c : {Case{3, 3, 0, 1, true, false, false}, Case{4, 2, 1, 1, true, false, false},
                        Case{4, 2, 0, 2, false, false, true}, Case{4, 2, 1, 1, false, true, false}}) {
    INFO("experts " << c.experts << " top_k " << c.top_k << " shared " << c.shared << " every " << c.every << " gate "
                    << c.gate << " qk_norm " << c.qk);
    RunSpec spec = moe_spec(c.experts, c.top_k, c.shared, c.every, c.norm, c.gate);
    spec.model.qk_norm = c.qk;
    const int N = 2 * 4;
    Stage st(spec, 0, 1, 0, 2, 1, 1.f / N);
    st.init_params(7);
    perturb(st, 3);
    REQUIRE((st.find("h.0.mlp.gate.weight") != nullptr) == (c.every == 1));
    REQUIRE(st.find("h.1.mlp.experts.gate_up_proj") != nullptr);
    REQUIRE((st.find("h.1.mlp.shared_experts.down_proj.weight") != nullptr) == (c.shared > 0));
    REQUIRE((st.find("h.1.mlp.shared_expert_gate.weight") != nullptr) == c.gate);
    REQUIRE((st.find("h.0.self_attn.k_norm.weight") != nullptr) == c.qk);
    auto tokens = random_tokens(N, 11, 1), targets = random_tokens(N, 11, 2);
    auto loss = [&] {
      st.set_tokens(0, tokens.data());
      st.set_targets(0, targets.data());
      return objective(st, spec, st.forward(0, 0, nullptr), N);
    };
    st.zero_grads();
    loss();
    st.backward(0, 0, nullptr, nullptr);
    std::vector<float> grads = st.grads().to_host();
    for (auto& p : st.params())
      gradcheck::check(p.name, loss, &st.weights().host()[p.offset], &grads[p.offset], p.size, 6, 1e-3f);
  }
}

TEST_CASE("MoE stage: split backward and recompute give the fused backward's gradients", "[moe]") {
  const int N = 2 * 4, C = 8;
  auto run = [&](const char* recompute, bool split) {
    RunSpec spec = moe_spec(4, 2, 1, 1, true, true);
    spec.model.qk_norm = true;
    spec.parallel.recompute = *choice_named<Recompute>(recompute);
    Stage st(spec, 0, 1, 0, 2, 1, 1.f / N);
    st.init_params(7);
    perturb(st, 5);
    st.zero_grads();
    auto tokens = random_tokens(N, 11, 3), targets = random_tokens(N, 11, 4);
    st.set_tokens(0, tokens.data());
    st.set_targets(0, targets.data());
    st.forward(0, 0, nullptr);
    if (split) {
      st.backward_input(0, 0, nullptr, nullptr);
      st.backward_weight(0, 0);
    } else {
      st.backward(0, 0, nullptr, nullptr);
    }
    (void)C;
    return st.grads().to_host();
  };
  const std::vector<float> fused = run("none", false);
  CHECK(run("none", true) == fused);
  for (const char* mode : {"block", "stage"}) {
    INFO(mode);
    CHECK(run(mode, false) == fused);
  }
}

TEST_CASE("MoE stage: each block's routing figures count a forward's tokens once, recompute aside", "[moe]") {
  const int N = 2 * 4;
  RunSpec spec = moe_spec(4, 2, 0, 1, true);
  spec.parallel.recompute = Recompute::stage;
  Stage st(spec, 0, 1, 0, 2, 1, 1.f / N);
  st.init_params(7);
  auto tokens = random_tokens(N, 11, 3), targets = random_tokens(N, 11, 4);
  st.set_tokens(0, tokens.data());
  st.set_targets(0, targets.data());
  st.forward(0, 0, nullptr);
  st.backward(0, 0, nullptr, nullptr);  // re-runs the forward: not counted again
  const auto figures = st.take_moe_figures();
  REQUIRE(figures.size() == 2);
  for (const auto& [block, f] : figures) {
    double chosen = 0;
    for (double n : f.chosen) chosen += n;
    CHECK(chosen == N * 2);
    CHECK(f.micro_batches == 1);
    CHECK(f.dropped == 0);
    CHECK(f.aux_loss > 0);
  }
  CHECK(st.take_moe_figures().empty());
}

TEST_CASE("MoE stage on two tensor ranks gives one rank's loss and gradients", "[moe]") {
  const int N = 2 * 4;
  for (auto [sp, kv] : {std::pair{false, 2}, {true, 2}, {false, 1}}) {
    INFO("sequence parallel " << sp << ", key/value heads " << kv);
    RunSpec spec = moe_spec(4, 2, 1, 1, true, true);
    spec.model.n_kv_head = kv;  // 1: one head both ranks hold, its norm's sums counted once
    spec.model.qk_norm = true;  // q and k normalised over the heads both ranks hold
    spec.parallel.sequence_parallel = sp;
    auto tokens = random_tokens(N, 11, 3), targets = random_tokens(N, 11, 4);
    auto run = [&](int tp, int rank, TensorGroup* group, double* loss) {
      spec.parallel.tp = tp;
      spec.parallel.sequence_parallel = sp && tp > 1;
      Stage st(spec, 0, 1, 0, 2, 1, 1.f / N, TpPart{rank, tp});
      if (group) st.set_tensor_group(group);
      st.init_params(7);
      st.zero_grads();
      st.set_tokens(0, tokens.data());
      st.set_targets(0, targets.data());
      *loss = st.forward(0, 0, nullptr);
      st.backward(0, 0, nullptr, nullptr);
      std::vector<std::pair<std::string, std::vector<float>>> whole;  // each tensor's gradient, this rank's part
      const std::vector<float> g = st.grads().to_host();
      for (const ParamTensor& p : st.params())
        whole.emplace_back(p.name, std::vector<float>(g.begin() + p.offset, g.begin() + p.offset + p.size));
      return std::make_pair(st.params(), whole);
    };
    double one_loss = 0;
    const auto [one_params, one] = run(1, 0, nullptr, &one_loss);
    double losses[2] = {0, 0};
    std::vector<std::pair<std::vector<ParamTensor>, std::vector<std::pair<std::string, std::vector<float>>>>> parts(2);
    testing::run_tensor_ranks(2,
                              [&](int rank, TensorGroup* group) { parts[rank] = run(2, rank, group, &losses[rank]); });
    CHECK(losses[0] + losses[1] == Approx(one_loss).epsilon(1e-6));
    for (size_t i = 0; i < one.size(); ++i) {
      INFO(one[i].first);
      for (int rank = 0; rank < 2; ++rank) {
        const ParamTensor& p = parts[rank].first[i];
        REQUIRE(p.name == one[i].first);
        std::vector<float> mine(p.size), got = parts[rank].second[i].second;
        take_part(p.tp, p.shape, one[i].second.data(), mine.data());
        // A norm's under sequence parallelism: each rank's rows' share; a key/value head both ranks
        // hold: each one's query heads' share; either summed at the step's end.
        if (p.sums_over_tokens || p.tp.shared())
          for (size_t j = 0; j < p.size; ++j) got[j] += parts[1 - rank].second[i].second[j];
        for (size_t j = 0; j < p.size; ++j) CHECK(got[j] == Approx(mine[j]).margin(1e-5).epsilon(1e-4));
      }
    }
  }
}

TEST_CASE("MoE stage on two expert ranks gives each replica's loss and gradients, an expert's summed over both",
          "[moe]") {
  const int N = 2 * 4;
  using Grads = std::vector<std::pair<ParamTensor, std::vector<float>>>;
  for (bool gate : {false, true}) {
    INFO("shared-expert gate " << gate);
    const RunSpec spec = moe_spec(4, 2, 1, 1, true, gate);
    const std::vector<int> tokens[2] = {random_tokens(N, 11, 3), random_tokens(N, 11, 5)},
                           targets[2] = {random_tokens(N, 11, 4), random_tokens(N, 11, 6)};
    // Replica `replica`'s micro-batch on expert rank `rank` of `ep`.
    auto run = [&](int ep, int rank, int replica, ExpertGroup* group, double* loss) {
      Stage st(spec, 0, 1, 0, 2, 1, 1.f / N, TpPart{}, TpPart{rank, ep});
      if (group) st.set_expert_group(group);
      st.init_params(7);  // per name: each expert rank its part of the same model
      st.zero_grads();
      st.set_tokens(0, tokens[replica].data());
      st.set_targets(0, targets[replica].data());
      *loss = st.forward(0, 0, nullptr);
      st.backward(0, 0, nullptr, nullptr);
      const std::vector<float> g = st.grads().to_host();
      Grads out;
      for (const ParamTensor& p : st.params())
        out.emplace_back(p, std::vector<float>(g.begin() + p.offset, g.begin() + p.offset + p.size));
      return out;
    };
    double alone[2], split[2];
    const Grads whole[2] = {run(1, 0, 0, nullptr, &alone[0]), run(1, 0, 1, nullptr, &alone[1])};
    Grads parts[2];
    testing::run_expert_ranks(
        2, [&](int rank, ExpertGroup* group) { parts[rank] = run(2, rank, rank, group, &split[rank]); });
    for (int r = 0; r < 2; ++r) {
      CHECK(split[r] == Approx(alone[r]).epsilon(1e-6));
      REQUIRE(parts[r].size() == whole[r].size());
      for (size_t i = 0; i < parts[r].size(); ++i) {
        const auto& [p, got] = parts[r][i];
        INFO(p.name << " on expert rank " << r);
        std::vector<float> want(whole[r][i].second);
        if (p.expert) {  // this rank's experts, which both replicas' tokens went through
          std::vector<float> sum(whole[0][i].second);
          for (size_t j = 0; j < sum.size(); ++j) sum[j] += whole[1][i].second[j];
          want.resize(p.size);
          take_part(p.tp, p.shape, sum.data(), want.data());
        }
        REQUIRE(got.size() == want.size());
        for (size_t j = 0; j < got.size(); ++j) CHECK(got[j] == Approx(want[j]).margin(1e-6).epsilon(1e-5));
      }
    }
    CHECK(parts[0][0].first.name == whole[0][0].first.name);
    CHECK(std::count_if(parts[0].begin(), parts[0].end(), [](const auto& t) { return t.first.expert; }) == 4);
  }
}

TEST_CASE("MoE stage: forward_cached, a prompt then one token at a time, gives forward()'s probabilities", "[moe]") {
  // Routing is per token (dropless), so a token chooses the same experts in a batch of one.
  RunSpec spec = moe_spec(4, 2, 1, 1, true);
  spec.model.seq_len = 12;
  spec.train.global_batch = 1;
  const int T = spec.model.seq_len, V = spec.model.vocab;
  Stage st(spec, 0, 1, 0, 2, 1, 1.f);
  st.init_params(3);
  perturb(st, 5);
  const std::vector<int> tokens = random_tokens(T, V, 9), targets(T, 0);
  st.set_tokens(0, tokens.data());
  st.set_targets(0, targets.data());
  st.forward(0, 0, nullptr);
  const std::vector<float> full(st.head_probs(0).host().begin(), st.head_probs(0).host().end());
  st.discard(0, 0);
  KvCache cache;
  std::vector<float> probs(static_cast<size_t>(T) * V);
  const int prompt = 5;
  st.forward_cached(tokens.data(), prompt, cache, probs.data());
  for (int t = prompt; t < T; ++t)
    st.forward_cached(tokens.data() + t, 1, cache, probs.data() + static_cast<size_t>(t) * V);
  for (size_t i = 0; i < full.size(); ++i) CHECK(probs[i] == Approx(full[i]).margin(1e-5));
}
