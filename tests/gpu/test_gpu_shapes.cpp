// The GPU kernels against their CPU twins at the shapes users run: GPT-2's and Llama 3's
// vocabularies (50,257 and 128,256) for the loss, the split vocabulary's loss and the embedding;
// T 2,048 attention with head sizes 64 and 128 and grouped heads; width 2,048 for the norms and
// the matrix products; a tensor of more than 2^31 values for AdamW and the squared norm (32-bit
// index overflow). Large outputs are compared on sampled rows. Tagged [big]: the GPU check runs
// them plainly, not under compute-sanitizer (minutes there).
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "gpu_test_util.hpp"
#include "pipetrain/compute/gpu.hpp"
#include "pipetrain/compute/gpu_kernels.hpp"
#include "pipetrain/compute/kernels.hpp"
#include "pipetrain/compute/ops.hpp"
#include "pipetrain/model/model.hpp"
#include "pipetrain/model/optim.hpp"

using namespace pipetrain;
using namespace pipetrain::gpu_test;

namespace {

// Rows to compare: the first, the last and a few between.
std::vector<size_t> sampled(size_t rows) { return {0, 1, rows / 3, rows / 2 + 7, rows - 2, rows - 1}; }

// Columns [c0, c1) of each row of a [rows, width] array.
Vec columns(const Vec& x, size_t width, size_t c0, size_t c1) {
  Vec out;
  for (size_t r = 0; r < x.size() / width; ++r)
    out.insert(out.end(), x.begin() + r * width + c0, x.begin() + r * width + c1);
  return out;
}

}  // namespace

TEST_CASE("softmax cross-entropy and the split vocabulary's loss at 50,257 and 128,256 tokens", "[gpu][big]") {
  const int N = 2048;
  for (int V : {50257, 128256}) {
    INFO("vocabulary " << V);
    const size_t NV = static_cast<size_t>(N) * V;
    const Vec logits = uniform(NV, 8, V);
    const auto tgt = tokens(N, V, 3);
    Vec probs(NV), dlogits(NV);
    const double loss = softmax_crossentropy_forward(probs.data(), logits.data(), tgt.data(), N, V);
    softmax_crossentropy_backward(dlogits.data(), probs.data(), tgt.data(), 1.f / N, N, V, 0);
    auto d_logits = up(logits);
    auto d_tgt = up(tgt);
    gpu::Buffer<float> d_probs(NV), d_dlogits(NV);
    CHECK(gpu::softmax_crossentropy_forward(d_probs.data(), d_logits.data(), d_tgt.data(), N, V) ==
          Approx(loss).epsilon(1e-6));
    gpu::softmax_crossentropy_backward(d_dlogits.data(), d_probs.data(), d_tgt.data(), 1.f / N, N, V, 0);
    const auto rows = sampled(N);
    CHECK(rel_err(down_rows(d_probs.data(), V, rows), host_rows(probs.data(), V, rows)) < kFp32);
    CHECK(rel_err(down_rows(d_dlogits.data(), V, rows), host_rows(dlogits.data(), V, rows)) < kFp32);

    // The second half of the vocabulary as one tensor rank holds it.
    const int v_begin = V / 2, Vp = V - v_begin;
    Vec part;
    for (int n = 0; n < N; ++n)
      part.insert(part.end(), logits.begin() + size_t(n) * V + v_begin, logits.begin() + size_t(n + 1) * V);
    Vec part_probs(part.size()), row_max(N);
    std::vector<double> stats(2 * N);
    vocab_softmax_max(row_max.data(), part.data(), N, Vp);
    vocab_softmax_exp(part_probs.data(), stats.data(), part.data(), row_max.data(), tgt.data(), N, Vp, v_begin);
    const double part_loss = vocab_softmax_finish(part_probs.data(), row_max.data(), stats.data(), N, Vp);
    auto d_part = up(part), d_max = up(Vec(N)), d_part_probs = up(Vec(part.size()));
    auto d_stats = up(std::vector<double>(2 * N));
    gpu::vocab_softmax_max(d_max.data(), d_part.data(), N, Vp);
    CHECK(down(d_max) == row_max);
    gpu::vocab_softmax_exp(d_part_probs.data(), d_stats.data(), d_part.data(), d_max.data(), d_tgt.data(), N, Vp,
                           v_begin);
    const std::vector<double> got = down(d_stats);
    double worst = 0;
    for (int i = 0; i < 2 * N; ++i)
      worst = std::max(worst, std::fabs(got[i] - stats[i]) / std::max(1e-30, std::fabs(stats[i])));
    CHECK(worst < 1e-6);
    CHECK(gpu::vocab_softmax_finish(d_part_probs.data(), d_max.data(), d_stats.data(), N, Vp) ==
          Approx(part_loss).epsilon(1e-6));
    CHECK(rel_err(down_rows(d_part_probs.data(), Vp, rows), host_rows(part_probs.data(), Vp, rows)) < kFp32);
  }
}

TEST_CASE("the embedding at 50,257 x 768 with positions and 128,256 x 2,048 without: the CPU's bits", "[gpu][big]") {
  struct Case {
    int V, C, B, T;
    bool positions;
  };
  for (Case c : {Case{50257, 768, 8, 1024, true}, Case{128256, 2048, 4, 2048, false}}) {
    INFO("vocabulary " << c.V << " width " << c.C);
    const size_t n = static_cast<size_t>(c.B) * c.T;
    // A third of the positions from 16 frequent tokens: rows with long runs of positions to add.
    auto tok = tokens(n, c.V, 5);
    for (size_t i = 0; i < n; i += 3) tok[i] = 1000 + static_cast<int>(i % 16);
    const Vec wte = uniform(static_cast<size_t>(c.V) * c.C, 1, 6), dout = uniform(n * c.C, 1, 7);
    const Vec wpe = c.positions ? uniform(static_cast<size_t>(c.T) * c.C, 1, 8) : Vec();
    Vec out(n * c.C), dwte = uniform(wte.size(), 1, 9), dwpe = uniform(wpe.size(), 1, 10);
    auto d_tok = up(tok);
    auto d_wte = up(wte), d_wpe = up(wpe), d_dout = up(dout), d_out = up(out), d_dwte = up(dwte), d_dwpe = up(dwpe);
    const float* wpe_p = c.positions ? wpe.data() : nullptr;
    encoder_forward(out.data(), tok.data(), wte.data(), wpe_p, c.B, c.T, c.C, 0, c.V, nullptr);
    gpu::encoder_forward(d_out.data(), d_tok.data(), d_wte.data(), c.positions ? d_wpe.data() : nullptr, c.B, c.T, c.C,
                         0, c.V, nullptr);
    const auto rows = sampled(n);
    CHECK(down_rows(d_out.data(), c.C, rows) == host_rows(out.data(), c.C, rows));
    encoder_backward(dwte.data(), c.positions ? dwpe.data() : nullptr, dout.data(), tok.data(), c.B, c.T, c.C, 0, c.V,
                     nullptr);
    gpu::encoder_backward(d_dwte.data(), c.positions ? d_dwpe.data() : nullptr, d_dout.data(), d_tok.data(), c.B, c.T,
                          c.C, 0, c.V, nullptr);
    // frequent rows, rows of single positions, rows no position holds, the first and the last
    std::vector<size_t> vocab_rows = {
        0, 1000, 1007, 1015, static_cast<size_t>(tok[1]), static_cast<size_t>(tok[2]), static_cast<size_t>(c.V) - 1};
    CHECK(down_rows(d_dwte.data(), c.C, vocab_rows) == host_rows(dwte.data(), c.C, vocab_rows));
    if (c.positions) CHECK(down(d_dwpe) == dwpe);
  }
}

TEST_CASE("attention at T 2,048: head sizes 64 and 128, grouped heads", "[gpu][big]") {
  struct Shape {
    int B, T, C, NH, NKV;
  };
  for (Shape s : {Shape{1, 2048, 768, 12, 4}, Shape{2, 2048, 1024, 8, 4}}) {
    const int B = s.B, T = s.T, C = s.C, NH = s.NH, NKV = s.NKV, KV = NKV * (C / NH), C3 = C + 2 * KV;
    INFO("B " << B << " T " << T << " head size " << C / NH << " NH " << NH << " NKV " << NKV);
    const size_t rows = static_cast<size_t>(B) * T;
    const Vec qkv = uniform(rows * C3, 2, 11), dout = uniform(rows * C, 1, 12);
    Vec out(rows * C), lse(static_cast<size_t>(B) * NH * T), dqkv(rows * C3);
    attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH, NKV, nullptr);
    attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH, NKV, nullptr);
    auto d_qkv = up(qkv), d_dout = up(dout);
    gpu::Buffer<float> d_out(out.size()), d_lse(lse.size()), d_dqkv(dqkv.size());
    gpu::attention_forward(d_out.data(), d_lse.data(), d_qkv.data(), B, T, C, NH, NKV, nullptr);
    gpu::attention_backward(d_dqkv.data(), d_dout.data(), d_qkv.data(), d_out.data(), d_lse.data(), B, T, C, NH, NKV,
                            nullptr);
    CHECK(rel_err(down(d_out), out) < kFp32);
    CHECK(rel_err(down(d_lse), lse) < kFp32);
    const Vec got = down(d_dqkv);  // dq, dk, dv apart: each against its own magnitude
    CHECK(rel_err(columns(got, C3, 0, C), columns(dqkv, C3, 0, C)) < kFp32);
    CHECK(rel_err(columns(got, C3, C, C + KV), columns(dqkv, C3, C, C + KV)) < kFp32);
    CHECK(rel_err(columns(got, C3, C + KV, C3), columns(dqkv, C3, C + KV, C3)) < kFp32);
  }
}

TEST_CASE("norms and matrix products at width 2,048", "[gpu][big]") {
  const int N = 1024, C = 2048, OC = 2048;
  const size_t NC = static_cast<size_t>(N) * C;
  const Vec x = uniform(NC, 2, 13), w = uniform(C, 1, 14), b = uniform(C, 1, 15), g = uniform(NC, 1, 16);
  Vec out(NC), mean(N), rstd(N), dx = uniform(NC, 1, 17), dw(C), db(C), rout(NC), rrstd(N), rdx = dx, rdw(C);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  layernorm_backward(dx.data(), dw.data(), db.data(), g.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
  rmsnorm_forward(rout.data(), rrstd.data(), x.data(), w.data(), N, C, 1e-5f);
  rmsnorm_backward(rdx.data(), rdw.data(), g.data(), x.data(), w.data(), rrstd.data(), N, C);
  auto d_x = up(x), d_w = up(w), d_b = up(b), d_g = up(g);
  auto d_out = up(Vec(NC)), d_mean = up(Vec(N)), d_rstd = up(Vec(N)), d_dx = up(uniform(NC, 1, 17)), d_dw = up(Vec(C)),
       d_db = up(Vec(C)), d_rout = up(Vec(NC)), d_rrstd = up(Vec(N)), d_rdx = up(uniform(NC, 1, 17)),
       d_rdw = up(Vec(C));
  gpu::layernorm_forward(d_out.data(), d_mean.data(), d_rstd.data(), d_x.data(), d_w.data(), d_b.data(), N, C);
  gpu::layernorm_backward(d_dx.data(), d_dw.data(), d_db.data(), d_g.data(), d_x.data(), d_w.data(), d_mean.data(),
                          d_rstd.data(), N, C);
  gpu::rmsnorm_forward(d_rout.data(), d_rrstd.data(), d_x.data(), d_w.data(), N, C, 1e-5f);
  gpu::rmsnorm_backward(d_rdx.data(), d_rdw.data(), d_g.data(), d_x.data(), d_w.data(), d_rrstd.data(), N, C);
  CHECK(rel_err(down(d_out), out) < kFp32);
  CHECK(rel_err(down(d_dx), dx) < kFp32);
  CHECK(rel_err(down(d_dw), dw) < kFp32);
  CHECK(rel_err(down(d_db), db) < kFp32);
  CHECK(rel_err(down(d_rout), rout) < kFp32);
  CHECK(rel_err(down(d_rdx), rdx) < kFp32);
  CHECK(rel_err(down(d_rdw), rdw) < kFp32);

  const Vec wm = uniform(static_cast<size_t>(OC) * C, 0.05f, 18), dout = uniform(static_cast<size_t>(N) * OC, 1, 19);
  for (auto dtype : {Dtype::fp32, Dtype::bf16}) {
    const bool bf16 = dtype == Dtype::bf16;
    INFO((bf16 ? "bf16" : "fp32"));
    // The CPU reference sees the inputs the tensor cores see; what remains is accumulation order.
    const Vec rx = bf16 ? rounded(x) : x, rw = bf16 ? rounded(wm) : wm, rd = bf16 ? rounded(dout) : dout;
    Vec mo(static_cast<size_t>(N) * OC), mdx(NC), mdw(wm.size());
    matmul_forward(mo.data(), rx.data(), rw.data(), nullptr, N, C, OC);
    matmul_backward(mdx.data(), mdw.data(), nullptr, rd.data(), rx.data(), rw.data(), N, C, OC);
    const Kernels& k = kernels(Device::gpu, dtype);
    auto d_wm = up(wm), d_dout = up(dout), d_mo = up(Vec(mo.size())), d_mdx = up(Vec(NC)), d_mdw = up(Vec(wm.size()));
    k.matmul_forward(d_mo.data(), d_x.data(), d_wm.data(), nullptr, N, C, OC);
    k.matmul_backward(d_mdx.data(), d_mdw.data(), nullptr, d_dout.data(), d_x.data(), d_wm.data(), N, C, OC);
    CHECK(rel_err(down(d_mo), mo) < kFp32);
    CHECK(rel_err(down(d_mdx), mdx) < kFp32);
    CHECK(rel_err(down(d_mdw), mdw) < kFp32);
  }
}

TEST_CASE("AdamW and the squared norm over a tensor of more than 2^31 values", "[gpu][big]") {
  const size_t n = (size_t(1) << 31) + 4099, bytes = 4 * n * sizeof(float);
  if (gpu::memory_total() < bytes + (size_t(4) << 30)) {
    WARN("skipped: " << bytes / (1 << 30) << " GiB of weights and moments do not fit this GPU");
    return;
  }
  gpu::Buffer<float> w(n), g(n), m(n), v(n);
  for (auto* b : {&w, &g, &m, &v}) gpu::zero(b->data(), sizeof(float) * n);
  // Values at positions around 2^31 (the first a 32-bit signed index cannot reach) and the last.
  const std::vector<size_t> at = {
      0, 1, (size_t(1) << 31) - 1, size_t(1) << 31, (size_t(1) << 31) + 1, (size_t(1) << 31) + 2048, n - 1};
  const size_t k = at.size();
  Vec hw(k), hg(k);
  double sq = 0;
  for (size_t i = 0; i < k; ++i) {
    hw[i] = 1.f + 0.25f * i, hg[i] = 0.5f - 0.125f * i, sq += double(hg[i]) * hg[i];
    gpu::copy_to_device(w.data() + at[i], &hw[i], sizeof(float));
    gpu::copy_to_device(g.data() + at[i], &hg[i], sizeof(float));
  }
  RunSpec::Train cfg;
  cfg.weight_decay = 0.1;
  ParamTensor p;
  p.name = "h.0.mlp.c_fc.weight", p.shape = {1, static_cast<int>(k)}, p.size = k, p.decay = true;
  AdamW adam(cfg, OptimizerShard({p}, 0, 1));  // the CPU's update of the same values
  Array<float> cpu_w, cpu_g;
  cpu_w.assign(hw.data(), k), cpu_g.assign(hg.data(), k);
  const double lr = 1e-3;
  adam.step({p}, cpu_w, cpu_g, lr, 1.f);
  gpu::adamw_update(w.data(), g.data(), m.data(), v.data(), n, float(cfg.beta1), float(cfg.beta2),
                    float(lr / (1 - cfg.beta1)), float(1 / std::sqrt(1 - cfg.beta2)), float(cfg.eps),
                    float(1 - lr * cfg.weight_decay), 1.f);
  auto sample = [&](const gpu::Buffer<float>& b) {
    Vec out(k);
    for (size_t i = 0; i < k; ++i) gpu::copy_to_host(&out[i], b.data() + at[i], sizeof(float));
    return out;
  };
  CHECK(rel_err(sample(w), cpu_w.to_host()) < kFp32);
  CHECK(rel_err(sample(m), adam.exp_avg().to_host()) < kFp32);
  CHECK(rel_err(sample(v), adam.exp_avg_sq().to_host()) < kFp32);
  float untouched = 1.f;  // a zero weight with a zero gradient stays zero
  gpu::copy_to_host(&untouched, w.data() + (size_t(1) << 31) + 77, sizeof(float));
  CHECK(untouched == 0.f);
  CHECK(gpu::sum_of_squares(g.data(), n) == Approx(sq).epsilon(1e-12));
}
