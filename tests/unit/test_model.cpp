// Whole-stage backward against finite differences (full model on one stage, a middle stage fed
// an activation, tied and untied heads), and recompute modes against each other.
#include <catch2/catch.hpp>

#include <algorithm>

#include "gradcheck.hpp"
#include "pipetrain/model/model.hpp"

using namespace pipetrain;
using gradcheck::randn;

namespace {

RunSpec small_spec(int n_layer, bool tied, const char* recompute = "none") {
  RunSpec s;
  s.model.n_layer = n_layer;
  s.model.d_model = 8;
  s.model.n_head = 2;
  s.model.seq_len = 4;
  s.model.vocab = 11;
  s.model.tie_embeddings = tied;
  s.train.global_batch = 2;
  s.parallel.micro_batches = 1;
  s.parallel.recompute = *choice_named<Recompute>(recompute);
  return s;
}

// GPT init has tiny weights (std 0.02) and so tiny gradients; spread them so differences are
// well above fp32 noise.
void perturb(Stage& st, uint32_t seed) {
  auto noise = randn(st.weights().host().size(), 0.3f, seed);
  for (size_t i = 0; i < noise.size(); ++i) st.weights().host()[i] += noise[i];
}

std::vector<int> random_tokens(size_t n, int vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int> t(n);
  for (auto& v : t) v = static_cast<int>(gen() % vocab);
  return t;
}

// Stage `stage_id` of a 6-block model cut in three, weights spread, gradients zeroed.
Stage third_of_six(int stage_id, int M, bool tied, uint32_t seed) {
  RunSpec spec = small_spec(6, tied);
  spec.train.global_batch = M;
  spec.parallel.micro_batches = M;
  Stage st(spec, stage_id, 3, 2 * stage_id, 2 * stage_id + 2, M, 0.1f);
  st.init_params(seed);
  perturb(st, seed + 1);
  st.zero_grads();
  return st;
}

// Random inputs (tokens, targets or a received activation) and the forward of micro-batches 0..M-1.
void forward_all(Stage& st, int M, size_t N, int C, int V, uint32_t seed) {
  std::vector<float> out(N * C);
  for (int mb = 0; mb < M; ++mb) {
    auto tokens = random_tokens(N, V, seed + mb), targets = random_tokens(N, V, seed + 10 + mb);
    if (st.has_embedding()) st.set_tokens(mb, tokens.data());
    if (st.has_head()) st.set_targets(mb, targets.data());
    if (!st.has_embedding()) {
      auto x = randn(N * C, 1.f, seed + 20 + mb);
      std::copy(x.begin(), x.end(), st.input_buffer(0, mb));
    }
    st.forward(0, mb, out.data());
  }
}

}  // namespace

TEST_CASE("full model on one stage: every parameter's gradient matches finite differences", "[model]") {
  for (bool tied : {true, false}) {
    RunSpec spec = small_spec(2, tied);
    const int N = 2 * 4;
    Stage st(spec, 0, 1, 0, 2, 1, 1.f / N);
    st.init_params(7);
    perturb(st, 3);
    auto tokens = random_tokens(N, 11, 1), targets = random_tokens(N, 11, 2);
    auto loss = [&] {
      st.set_tokens(0, tokens.data());
      st.set_targets(0, targets.data());
      return st.forward(0, 0, nullptr) / N;
    };
    st.zero_grads();
    loss();
    st.backward(0, 0, nullptr, nullptr);
    std::vector<float> grads = st.grads().to_host();
    CHECK((st.find("lm_head.weight") != nullptr) == !tied);
    for (auto& p : st.params())
      gradcheck::check((tied ? "tied " : "untied ") + p.name, loss, &st.weights().host()[p.offset], &grads[p.offset],
                       p.size, 6);
  }
}

TEST_CASE("middle stage: input and parameter gradients match finite differences", "[model]") {
  RunSpec spec = small_spec(3, true);
  const int N = 2 * 4, C = 8;
  Stage st(spec, 1, 3, 1, 2, 1, 1.f / N);
  st.init_params(7);
  perturb(st, 4);
  REQUIRE(st.find("h.1.attn.c_attn.weight") != nullptr);  // global block index in names
  REQUIRE(st.find("wte.weight") == nullptr);
  auto x = randn(N * C, 1.f, 5), r = randn(N * C, 1.f, 6);
  std::vector<float> out(N * C);
  auto loss = [&] {
    std::copy(x.begin(), x.end(), st.input_buffer(0, 0));
    st.forward(0, 0, out.data());
    return gradcheck::dot(out, r);
  };
  st.zero_grads();
  loss();
  std::vector<float> dx(N * C);
  st.backward(0, 0, r.data(), dx.data());
  std::vector<float> grads = st.grads().to_host();
  gradcheck::check("stage input", loss, x.data(), dx.data(), x.size(), 12);
  for (auto& p : st.params())
    gradcheck::check(p.name, loss, &st.weights().host()[p.offset], &grads[p.offset], p.size, 4);
}

TEST_CASE("recompute none, stage and block give identical gradients and stash what each mode says", "[model]") {
  const int M = 2, b = 1, T = 4, C = 8, NH = 2, V = 11, L = 2;
  const size_t N = static_cast<size_t>(b) * T;
  for (int stage_id : {0, 1, 2}) {  // first, middle, last of 3 stages (2 blocks each)
    std::vector<std::vector<float>> grads, dinps;
    std::vector<double> losses;
    for (const char* mode : {"none", "stage", "block"}) {
      RunSpec spec = small_spec(6, true, mode);
      spec.train.global_batch = 2;
      spec.parallel.micro_batches = M;
      Stage st(spec, stage_id, 3, 2 * stage_id, 2 * stage_id + 2, M, 0.1f);
      st.init_params(9);
      st.zero_grads();
      std::vector<float> out(N * C), dinp(N * C), accumulated_dinp;
      double loss = 0;
      for (int mb = 0; mb < M; ++mb) {
        auto tokens = random_tokens(N, V, 10 + mb), targets = random_tokens(N, V, 20 + mb);
        if (st.has_embedding()) st.set_tokens(mb, tokens.data());
        if (st.has_head()) st.set_targets(mb, targets.data());
        if (!st.has_embedding()) {
          auto x = randn(N * C, 1.f, 30 + mb);
          std::copy(x.begin(), x.end(), st.input_buffer(0, mb));
        }
        loss += st.forward(0, mb, out.data());
        // bytes kept between forward and backward, by the formula of the recompute mode
        size_t expect = 4 * N * ((st.has_embedding() ? 1 : 0) + (st.has_head() ? 1 : 0));
        const std::string m = mode;
        if (m == "none")
          expect += 4 * (L * (N * (16 * C + 4) + static_cast<size_t>(b) * NH * T) +
                         (st.has_head() ? N * (2 * C + 2 + V) : 0));
        if (m == "block") expect += 4 * N * C * (L + (st.has_head() ? 1 : 0));
        if (m == "stage" && !st.has_embedding()) expect += 4 * N * C;
        INFO("stage " << stage_id << " mode " << m);
        CHECK(st.stash_bytes(0, mb) == expect);
        CHECK(stash_bytes_per_micro_batch(spec, stage_id, 3, {0, 2}, *choice_named<Recompute>(m)) == expect);
      }
      for (int mb = M - 1; mb >= 0; --mb) {
        auto r = randn(N * C, 1.f, 40 + mb);
        st.backward(0, mb, r.data(), dinp.data());
        CHECK(st.stash_bytes(0, mb) == 0);
        accumulated_dinp.insert(accumulated_dinp.end(), dinp.begin(), dinp.end());
      }
      grads.push_back(st.grads().to_host());
      dinps.push_back(accumulated_dinp);
      losses.push_back(loss);
    }
    for (int m = 1; m < 3; ++m) {
      INFO("stage " << stage_id << " recompute mode #" << m << " vs none");
      CHECK(grads[m] == grads[0]);  // same kernels in the same order: bit-identical
      CHECK(losses[m] == losses[0]);
      if (stage_id > 0) CHECK(dinps[m] == dinps[0]);
    }
  }
}

TEST_CASE("parameter init is keyed by name, not by stage or layout", "[model]") {
  RunSpec spec = small_spec(4, true);
  Stage whole(spec, 0, 1, 0, 4, 1, 1.f);
  Stage second_half(spec, 1, 2, 2, 4, 1, 1.f);
  whole.init_params(42);
  second_half.init_params(42);
  for (auto& p : second_half.params()) {
    const ParamTensor* q = whole.find(p.name);
    REQUIRE(q != nullptr);
    INFO(p.name);
    CHECK(std::equal(whole.weights().host().begin() + q->offset, whole.weights().host().begin() + q->offset + q->size,
                     second_half.weights().host().begin() + p.offset));
  }
  // the last stage's tied copy of wte is excluded from the global gradient norm
  CHECK(second_half.find("wte.weight")->tied_copy);
  CHECK_FALSE(whole.find("wte.weight")->tied_copy);
}

TEST_CASE("split backward (input half, later weight half) gives the fused backward's bits, holding W-grads in between",
          "[model]") {
  const int M = 3, T = 4, C = 8, V = 11, L = 2;
  const size_t N = static_cast<size_t>(T);  // one sample per micro-batch
  for (int stage_id : {0, 1, 2}) {          // first, middle, last of 3 stages
    std::vector<std::vector<float>> grads, dinps;
    for (bool split : {false, true}) {
      Stage st = third_of_six(stage_id, M, true, 9);
      std::vector<float> dinp(N * C), all_dinp;
      forward_all(st, M, N, C, V, 10);
      // zero-bubble order: all input halves first, then the weight halves in another order
      for (int mb = 0; mb < M; ++mb) {
        auto r = randn(N * C, 1.f, 40 + mb);
        const size_t before = st.stash_bytes(0, mb);
        if (!split) {
          st.backward(0, mb, r.data(), dinp.data());
        } else {
          st.backward_input(0, mb, r.data(), dinp.data());
          // it keeps every layer's output gradient: 11 C per token per block, plus the head's / embedding's
          const size_t wgrads =
              4 * (L * 11 * N * C + (st.has_head() ? N * (V + C) : 0) + (st.has_embedding() ? N * C : 0));
          CHECK(st.stash_bytes(0, mb) == before + wgrads);
        }
        all_dinp.insert(all_dinp.end(), dinp.begin(), dinp.end());
      }
      if (split)
        for (int mb : {2, 0, 1}) {
          st.backward_weight(0, mb);
          CHECK(st.stash_bytes(0, mb) == 0);
        }
      grads.push_back(st.grads().to_host());
      dinps.push_back(all_dinp);
    }
    INFO("stage " << stage_id);
    if (stage_id > 0) CHECK(dinps[1] == dinps[0]);
    // The weight halves ran in another micro-batch order, so sums differ by float rounding only:
    // a few ulps of the largest gradient (a wrong or missing term would be O(1) of it).
    REQUIRE(grads[1].size() == grads[0].size());
    double worst = 0, largest = 0;
    for (size_t i = 0; i < grads[0].size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(grads[1][i]) - grads[0][i]));
      largest = std::max(largest, std::abs(static_cast<double>(grads[0][i])));
    }
    CHECK(worst <= 1e-6 * largest);
  }
}

TEST_CASE("split backward in the fused order is bit-identical to the fused backward", "[model]") {
  const int M = 2, T = 4, C = 8, V = 11;
  const size_t N = static_cast<size_t>(T);
  for (int stage_id : {0, 1, 2}) {
    std::vector<std::vector<float>> grads;
    for (bool split : {false, true}) {
      Stage st = third_of_six(stage_id, M, false, 3);
      std::vector<float> dinp(N * C);
      forward_all(st, M, N, C, V, 1);
      for (int mb = 0; mb < M; ++mb) {
        auto r = randn(N * C, 1.f, 7 + mb);
        if (split) {
          st.backward_input(0, mb, r.data(), dinp.data());
          st.backward_weight(0, mb);
        } else {
          st.backward(0, mb, r.data(), dinp.data());
        }
      }
      grads.push_back(st.grads().to_host());
    }
    INFO("stage " << stage_id);
    CHECK(grads[1] == grads[0]);
  }
}

TEST_CASE("a stage of two chunks lays them out one after the other and computes each as a one-chunk stage, bit for bit",
          "[model]") {
  // Rank 1 of pp = 2 with 2 chunks of a 6-block model cut {2, 1, 1, 2}: virtual stages 1 and 3
  // (blocks 2 and 4-5, the head), against one-chunk stages of the same virtual stages.
  const int M = 2;
  RunSpec spec = small_spec(6, false);
  spec.train.global_batch = M;
  spec.parallel.micro_batches = M;
  Stage both(spec, chunks_of({2, 1, 1, 2}, ChunkPlacement{2, 2}, 1), 4, M, 0.1f);
  Stage v1(spec, 1, 4, 2, 3, M, 0.1f), v3(spec, 3, 4, 4, 6, M, 0.1f);
  for (Stage* st : {&both, &v1, &v3}) {
    st->init_params(5);
    st->zero_grads();
  }
  REQUIRE(both.chunks() == 2);
  CHECK(!both.has_embedding());
  CHECK(both.has_head());
  CHECK((!both.first(0) && !both.last(0) && both.last(1)));
  // Parameters: v1's tensors, then v3's, offsets running on.
  std::vector<std::string> names;
  for (const Stage* st : {&v1, &v3})
    for (auto& p : st->params()) names.push_back(p.name);
  REQUIRE(both.params().size() == names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    CHECK(both.params()[i].name == names[i]);
    if (i > 0) CHECK(both.params()[i].offset == both.params()[i - 1].offset + both.params()[i - 1].size);
  }
  REQUIRE(both.weights().host().size() == v1.weights().host().size() + v3.weights().host().size());

  const size_t N = 4, C = 8, NC = N * C;
  std::vector<float> out(NC), out1(NC), g_in(NC), dinp(NC), dinp1(NC);
  for (int mb = 0; mb < M; ++mb) {  // interleaved: chunk 0 of mb, then chunk 1 of mb
    auto x = randn(NC, 1.f, 30 + mb);
    std::copy(x.begin(), x.end(), both.input_buffer(0, mb));
    std::copy(x.begin(), x.end(), v1.input_buffer(0, mb));
    both.forward(0, mb, out.data());
    v1.forward(0, mb, out1.data());
    CHECK(out == out1);
    auto targets = random_tokens(N, 11, 40 + mb);
    both.set_targets(mb, targets.data());
    v3.set_targets(mb, targets.data());
    std::copy(out.begin(), out.end(), both.input_buffer(1, mb));
    std::copy(out.begin(), out.end(), v3.input_buffer(0, mb));
    CHECK(both.forward(1, mb, nullptr) == v3.forward(0, mb, nullptr));
  }
  for (int mb = M - 1; mb >= 0; --mb) {
    both.backward(1, mb, nullptr, g_in.data());
    v3.backward(0, mb, nullptr, dinp1.data());
    CHECK(g_in == dinp1);
    both.backward(0, mb, g_in.data(), dinp.data());
    v1.backward(0, mb, dinp1.data(), out1.data());  // out1 now holds v1's input gradient
    CHECK(dinp == out1);
    CHECK(both.stash_bytes(0, mb) == 0);
    CHECK(both.stash_bytes(1, mb) == 0);
  }
  std::vector<float> grads = v1.grads().to_host();
  grads.insert(grads.end(), v3.grads().host().begin(), v3.grads().host().end());
  CHECK(both.grads().to_host() == grads);
}

TEST_CASE("block tensor table: parameter names, shapes, offsets and the layers' pointers agree", "[model]") {
  for (const auto& [arch, bias] : {std::pair{Arch::gpt2, false}, {Arch::llama, false}, {Arch::llama, true}}) {
    INFO(name_of(arch) << (bias ? " with q, k, v biases" : ""));
    RunSpec spec = small_spec(3, true);
    spec.model.arch = arch;
    spec.model.attention_bias = bias;
    spec.model.n_kv_head = arch == Arch::llama ? 1 : 0;  // grouped: k and v narrower than q
    spec.model.ffn_hidden = arch == Arch::llama ? 12 : 0;
    const BlockShape shape = block_shape(spec);
    Stage st(spec, 0, 1, 0, 3, 1, 1.f);
    auto& w = st.weights().host();
    for (int block = 0; block < 3; ++block) {
      const ParamTensor* first = st.find(block_tensor_name(block, block_tensors(arch).front()));
      REQUIRE(first != nullptr);
      const BlockPtrs ptrs = block_ptrs_from(w.data() + first->offset, shape);
      size_t next = first->offset;
      for (const BlockTensor& t : block_tensors(arch)) {
        const ParamTensor* p = st.find(block_tensor_name(block, t));
        INFO(block_tensor_name(block, t));
        if (!held(t, shape)) {  // the biases of a llama without them
          CHECK(p == nullptr);
          CHECK((t.field == nullptr || ptrs.*t.field == nullptr));
          continue;
        }
        REQUIRE(p != nullptr);
        CHECK(p->shape == shape_of(t, shape));
        CHECK(p->offset == next);  // one after another: k, v continue q's product, up continues gate's
        next = p->offset + p->size;
        CHECK(p->decay == (t.cols != Dim::none));                   // decay on the 2-D weights only
        if (t.field) CHECK(ptrs.*t.field == w.data() + p->offset);  // the layers read exactly the named tensor
      }
    }
    CHECK((st.find("wpe.weight") != nullptr) == (arch == Arch::gpt2));  // llama: rotary positions
    CHECK((st.find("ln_f.bias") != nullptr) == (arch == Arch::gpt2));   // RMSNorm has no bias
  }
  const RunSpec spec = small_spec(3, true);
  Stage st(spec, 0, 1, 0, 3, 1, 1.f);
  auto& w = st.weights().host();
  // Initialisation follows the table: LayerNorm weights 1, biases 0, weights drawn.
  st.init_params(7);
  const ParamTensor* ln = st.find("h.1.ln_2.weight");
  const ParamTensor* bias = st.find("h.1.mlp.c_fc.bias");
  const ParamTensor* proj = st.find("h.1.attn.c_proj.weight");
  CHECK(std::all_of(w.begin() + ln->offset, w.begin() + ln->offset + ln->size, [](float v) { return v == 1.f; }));
  CHECK(std::all_of(w.begin() + bias->offset, w.begin() + bias->offset + bias->size, [](float v) { return v == 0.f; }));
  CHECK(std::any_of(w.begin() + proj->offset, w.begin() + proj->offset + proj->size, [](float v) { return v != 0.f; }));
}

TEST_CASE("buffer pools: a rank's chunks share one only when they have the same shape", "[model]") {
  // A vee over 4 virtual stages on rank 0: the first chunk (embedding) and the last (head).
  CHECK(buffer_pools({{0, 0, 2}, {3, 6, 8}}, 4) == std::vector<int>{0, 1});
  // Interleaved middle chunks of equal size share; an uneven one gets its own.
  CHECK(buffer_pools({{1, 2, 4}, {3, 6, 8}, {5, 10, 11}}, 7) == std::vector<int>{0, 0, 1});
  CHECK(buffer_pools({{1, 2, 4}}, 3) == std::vector<int>{0});
}

namespace {
// One sequence of seq_len 20 over a vocabulary of 13 in either family (llama: 4 query heads over 2
// key/value heads, SwiGLU 40), as generation runs it.
RunSpec one_sequence_spec(Arch arch, int layers, int d_model) {
  RunSpec spec = small_spec(layers, true);
  spec.model.arch = arch;
  spec.model.d_model = d_model;
  spec.model.n_head = arch == Arch::llama ? 4 : 2;
  spec.model.n_kv_head = arch == Arch::llama ? 2 : 0;
  spec.model.ffn_hidden = arch == Arch::llama ? 40 : 0;
  spec.model.seq_len = 20;
  spec.model.vocab = 13;
  spec.train.global_batch = 1;
  return spec;
}
}  // namespace

TEST_CASE("forward_cached: a prompt then one token at a time gives forward()'s probabilities", "[model]") {
  // One sequence of seq_len 20 (several attention tiles, a window past one 16-column tile), heads
  // 16 wide: the cached path's tile products and row softmax are the training ones. The llama
  // family too: rotary angles from each token's own position, a cache of its key/value heads only.
  const Arch arch = GENERATE(Arch::gpt2, Arch::llama);
  INFO(name_of(arch));
  const RunSpec spec = one_sequence_spec(arch, 3, 64);
  const int T = spec.model.seq_len, V = spec.model.vocab;
  Stage st(spec, 0, 1, 0, 3, 1, 1.f);
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
  const int prompt = 7;
  st.forward_cached(tokens.data(), prompt, cache, probs.data());
  for (int t = prompt; t < T; ++t)
    st.forward_cached(tokens.data() + t, 1, cache, probs.data() + static_cast<size_t>(t) * V);
  CHECK(cache.pos == T);
  CHECK(cache.k[0].size() == static_cast<size_t>(T) * block_shape(spec).kv);  // NKV heads, not NH
  float worst = 0;
  for (size_t i = 0; i < full.size(); ++i) worst = std::max(worst, std::abs(probs[i] - full[i]));
  CHECK(worst < 1e-5f);  // the same layers; only the matrix products' row counts differ
  CHECK_THROWS_AS(st.forward_cached(tokens.data(), 1, cache, probs.data()), std::logic_error);  // full
}

TEST_CASE("under a document mask a document's next-token probabilities are its own alone, cached or not", "[model]") {
  // Documents begin at the separator (positions 6 and 13) and count their positions from 0: the
  // last one's rows equal a forward of it alone at the sequence's start, by the training forward
  // and by the KV cache fed 10 tokens then one at a time; without the mask they do not.
  const Arch arch = GENERATE(Arch::gpt2, Arch::llama);
  INFO(name_of(arch));
  const RunSpec spec = one_sequence_spec(arch, 2, 32);
  const int T = spec.model.seq_len, V = spec.model.vocab, separator = 3, last = 13;
  Stage st(spec, 0, 1, 0, 2, 1, 1.f);
  st.init_params(3);
  perturb(st, 5);
  st.set_document_mask({separator, true});
  std::vector<int> tokens = random_tokens(T, V, 9);
  for (int& t : tokens) t = t == separator ? separator + 1 : t;
  tokens[6] = tokens[last] = separator;
  auto forward = [&](const std::vector<int>& in) {
    const std::vector<int> targets(T, 0);
    st.set_tokens(0, in.data());
    st.set_targets(0, targets.data());
    st.set_documents(0, in.data());
    st.forward(0, 0, nullptr);
    std::vector<float> probs(st.head_probs(0).host().begin(), st.head_probs(0).host().end());
    st.discard(0, 0);
    return probs;
  };
  std::vector<int> alone(tokens.begin() + last, tokens.end());
  alone.resize(T, 0);  // padding after it: causal attention keeps it from the document's rows
  const std::vector<float> packed = forward(tokens), own = forward(alone);
  auto worst_from = [&](const std::vector<float>& probs) {
    float worst = 0;
    for (int i = 0; i < (T - last) * V; ++i) worst = std::max(worst, std::abs(probs[last * V + i] - own[i]));
    return worst;
  };
  CHECK(worst_from(packed) < 1e-5f);

  KvCache cache;
  std::vector<float> cached(static_cast<size_t>(T) * V);
  st.forward_cached(tokens.data(), 10, cache, cached.data());
  for (int t = 10; t < T; ++t)
    st.forward_cached(tokens.data() + t, 1, cache, cached.data() + static_cast<size_t>(t) * V);
  CHECK(cache.document == last);
  CHECK(worst_from(cached) < 1e-5f);

  st.set_document_mask({});
  CHECK(worst_from(forward(tokens)) > 1e-3f);
}
