// Every GPU kernel against its CPU twin on the same random inputs at small shapes (not multiples of
// the warp size or of attention's tiles), both halves of each backward apart and together, bf16
// products against the CPU on bf16-rounded inputs, and whole stages. The production shapes are in
// test_gpu_shapes.cpp, repeatability and zero sizes in test_gpu_repeat.cpp. Exits 77 (CTest:
// skipped) without a GPU.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "gpu_test_util.hpp"
#include "pipetrain/compute/gpu.hpp"
#include "pipetrain/compute/gpu_kernels.hpp"
#include "pipetrain/compute/kernels.hpp"
#include "pipetrain/compute/moe_kernels.hpp"
#include "pipetrain/compute/ops.hpp"
#include "pipetrain/model/model.hpp"
#include "pipetrain/model/optim.hpp"

using namespace pipetrain;
using namespace pipetrain::gpu_test;

TEST_CASE("encoder forward and backward match the CPU", "[gpu]") {
  const int B = 2, T = 5, C = 37, V = 11;
  auto tok = tokens(B * T, V, 1);
  Vec wte = randn(V * C, 1, 2), wpe = randn(T * C, 1, 3), dout = randn(B * T * C, 1, 4);
  Vec out(B * T * C), dwte = randn(V * C, 1, 5), dwpe = randn(T * C, 1, 6);
  auto d_tok = up(tok);
  auto d_wte = up(wte), d_wpe = up(wpe), d_out = up(out), d_dout = up(dout), d_dwte = up(dwte), d_dwpe = up(dwpe);
  encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C, 0, V, nullptr);
  gpu::encoder_forward(d_out.data(), d_tok.data(), d_wte.data(), d_wpe.data(), B, T, C, 0, V, nullptr);
  CHECK(rel_err(down(d_out), out) == 0);
  encoder_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C, 0, V, nullptr);
  gpu::encoder_backward(d_dwte.data(), d_dwpe.data(), d_dout.data(), d_tok.data(), B, T, C, 0, V, nullptr);
  // each row adds its positions in position order, as the CPU does: the CPU's bits
  CHECK(down(d_dwte) == dwte);
  CHECK(down(d_dwpe) == dwpe);
}

TEST_CASE("layernorm forward and both halves of its backward match the CPU", "[gpu]") {
  const int N = 263, C = 77;  // N > 256: two column partials; N % 8 != 0: a part-filled block
  Vec x = randn(N * C, 2, 1), w = randn(C, 1, 2), b = randn(C, 1, 3), dout = randn(N * C, 1, 4);
  Vec out(N * C), mean(N), rstd(N);
  auto d_x = up(x), d_w = up(w), d_b = up(b), d_dout = up(dout), d_out = up(out), d_mean = up(mean), d_rstd = up(rstd);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  gpu::layernorm_forward(d_out.data(), d_mean.data(), d_rstd.data(), d_x.data(), d_w.data(), d_b.data(), N, C);
  CHECK(rel_err(down(d_out), out) < kFp32);
  CHECK(rel_err(down(d_mean), mean) < kFp32);
  CHECK(rel_err(down(d_rstd), rstd) < kFp32);
  for (int half = 0; half < 3; ++half) {  // 0: both, 1: input only, 2: parameters only
    INFO("half " << half);
    Vec dx = randn(N * C, 1, 5), dw = randn(C, 1, 6), db = randn(C, 1, 7);  // dinp accumulates too
    auto d_dx = up(dx), d_dw = up(dw), d_db = up(db);
    const bool input = half != 2, params = half != 1;
    layernorm_backward(input ? dx.data() : nullptr, params ? dw.data() : nullptr, params ? db.data() : nullptr,
                       dout.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
    gpu::layernorm_backward(input ? d_dx.data() : nullptr, params ? d_dw.data() : nullptr,
                            params ? d_db.data() : nullptr, d_dout.data(), d_x.data(), d_w.data(), d_mean.data(),
                            d_rstd.data(), N, C);
    CHECK(rel_err(down(d_dx), dx) < kFp32);
    CHECK(rel_err(down(d_dw), dw) < kFp32);
    CHECK(rel_err(down(d_db), db) < kFp32);
  }
}

TEST_CASE("matmul forward and backward match the CPU in fp32, and in bf16 on bf16-rounded inputs", "[gpu]") {
  const int N = 13, C = 35, OC = 29;
  Vec x = randn(N * C, 1, 1), w = randn(OC * C, 0.2f, 2), bias = randn(OC, 1, 3), dout = randn(N * OC, 1, 4);
  for (auto dtype : {Dtype::fp32, Dtype::bf16}) {
    const bool bf16 = dtype == Dtype::bf16;
    INFO((bf16 ? "bf16" : "fp32"));
    const Kernels& k = kernels(Device::gpu, dtype);
    // The CPU reference sees the inputs the tensor cores see; what remains is accumulation order.
    Vec rx = bf16 ? rounded(x) : x, rw = bf16 ? rounded(w) : w, rd = bf16 ? rounded(dout) : dout;
    Vec out(N * OC);
    auto d_x = up(x), d_w = up(w), d_bias = up(bias), d_dout = up(dout), d_out = up(out);
    matmul_forward(out.data(), rx.data(), rw.data(), bias.data(), N, C, OC);
    k.matmul_forward(d_out.data(), d_x.data(), d_w.data(), d_bias.data(), N, C, OC);
    CHECK(rel_err(down(d_out), out) < kFp32);
    for (int half = 0; half < 3; ++half) {
      INFO("half " << half);
      const bool input = half != 2, params = half != 1;
      Vec dx = randn(N * C, 1, 7), dw = randn(OC * C, 1, 5), db = randn(OC, 1, 6);  // dx: overwritten
      auto d_dx = up(dx), d_dw = up(dw), d_db = up(db);
      matmul_backward(input ? dx.data() : nullptr, params ? dw.data() : nullptr, params ? db.data() : nullptr,
                      rd.data(), rx.data(), rw.data(), N, C, OC);
      // the bias gradient sums the fp32 dout, not its rounding
      if (params && bf16)
        for (int o = 0; o < OC; ++o)
          for (int n = 0; n < N; ++n) db[o] += dout[n * OC + o] - rd[n * OC + o];
      k.matmul_backward(input ? d_dx.data() : nullptr, params ? d_dw.data() : nullptr, params ? d_db.data() : nullptr,
                        d_dout.data(), d_x.data(), d_w.data(), N, C, OC);
      CHECK(rel_err(down(d_dx), dx) < kFp32);
      CHECK(rel_err(down(d_dw), dw) < kFp32);
      CHECK(rel_err(down(d_db), db) < kFp32);
    }
    // Against the unrounded fp32 product: bf16 keeps 8 significant bits, so each input is off by
    // at most 2^-9 relative and the product by about 2^-8 of the magnitude.
    Vec exact(N * OC);
    matmul_forward(exact.data(), x.data(), w.data(), bias.data(), N, C, OC);
    CHECK(rel_err(down(d_out), exact) < (bf16 ? 1.0 / 128 : kFp32));
  }
}

TEST_CASE("under bf16 the GPU rounds the operands the precision policy rounds and keeps the rest fp32", "[gpu]") {
  // As the CPU's test (test_bf16_products.cpp): operands on bf16's grid moved by 2^-12 of
  // themselves, under half a bf16 step. A rounded operand rounds back (the outputs keep their
  // bits); one kept fp32 changes them.
  const Kernels& k = kernels(Device::gpu, Dtype::bf16);
  const int N = 6, C = 16, OC = 12;
  auto nudged = [](Vec v) {
    for (float& f : v) f += std::ldexp(f, -12);
    return v;
  };
  const Vec x = rounded(randn(N * C, 1, 1)), w = rounded(randn(OC * C, 1, 2)), bias = rounded(randn(OC, 1, 3)),
            dout = rounded(randn(N * OC, 1, 4));
  auto run = [&](const Vec& x_, const Vec& w_, const Vec& b_, const Vec& d_) {
    auto d_x = up(x_), d_w = up(w_), d_b = up(b_), d_d = up(d_), d_out = up(Vec(N * OC)), d_dx = up(Vec(N * C)),
         d_dw = up(Vec(OC * C)), d_db = up(Vec(OC));
    k.matmul_forward(d_out.data(), d_x.data(), d_w.data(), d_b.data(), N, C, OC);
    k.matmul_backward(d_dx.data(), d_dw.data(), d_db.data(), d_d.data(), d_x.data(), d_w.data(), N, C, OC);
    return std::vector<Vec>{down(d_out), down(d_dx), down(d_dw), down(d_db)};
  };
  const auto base = run(x, w, bias, dout);
  for (const auto& o : {run(nudged(x), w, bias, dout), run(x, nudged(w), bias, dout)})
    for (int i = 0; i < 3; ++i) CHECK(o[i] == base[i]);
  const auto d = run(x, w, bias, nudged(dout));
  CHECK(d[1] == base[1]);
  CHECK(d[2] == base[2]);
  CHECK(d[3] != base[3]);  // the bias gradient sums the fp32 output gradient
  CHECK(run(x, w, nudged(bias), dout)[0] != base[0]);
  const Kernels& fp32 = kernels(Device::gpu, Dtype::fp32);
  CHECK(k.attention_forward == fp32.attention_forward);
  CHECK(k.layernorm_forward == fp32.layernorm_forward);
  CHECK(k.softmax_crossentropy_forward == fp32.softmax_crossentropy_forward);
}

TEST_CASE("causal attention forward and backward match the CPU", "[gpu]") {
  struct Shape {
    int B, T, C, NH, NKV;
  };
  // T not a multiple of the 32-row tiles, T of one row, head sizes of 4 to 256 (an odd one too),
  // grouped query heads (2 per key/value head, and multi-query)
  for (Shape s : {Shape{2, 9, 16, 4, 4}, Shape{1, 150, 96, 2, 2}, Shape{2, 9, 32, 4, 2}, Shape{1, 40, 32, 4, 1},
                  Shape{1, 1, 64, 2, 1}, Shape{1, 97, 90, 2, 1}, Shape{1, 70, 512, 2, 2}, Shape{2, 64, 512, 4, 2}}) {
    const int B = s.B, T = s.T, C = s.C, NH = s.NH, NKV = s.NKV, C3 = C + 2 * NKV * (C / NH);
    INFO("B " << B << " T " << T << " C " << C << " NH " << NH << " NKV " << NKV);
    Vec qkv = randn(B * T * C3, 1, 1), dout = randn(B * T * C, 1, 2);
    Vec out(B * T * C), lse(B * NH * T), dqkv = randn(B * T * C3, 1, 3);  // dqkv: overwritten
    auto d_qkv = up(qkv), d_dout = up(dout), d_out = up(out), d_lse = up(Vec(lse.size(), -1.f)), d_dqkv = up(dqkv);
    attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH, NKV, nullptr);
    gpu::attention_forward(d_out.data(), d_lse.data(), d_qkv.data(), B, T, C, NH, NKV, nullptr);
    CHECK(rel_err(down(d_out), out) < kFp32);
    CHECK(rel_err(down(d_lse), lse) < kFp32);
    attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH, NKV, nullptr);
    gpu::attention_backward(d_dqkv.data(), d_dout.data(), d_qkv.data(), d_out.data(), d_lse.data(), B, T, C, NH, NKV,
                            nullptr);
    CHECK(rel_err(down(d_dqkv), dqkv) < kFp32);
  }
}

TEST_CASE("document-masked attention, and positions restarting per document, match the CPU", "[gpu]") {
  // documents across the 32-row tiles (starts 0, 5, 6, 31, 32, 70, 149 of sequence 0; sequence 1 one
  // document): the GPU's tile skipping and lane masks against the CPU's
  const int B = 2, T = 150, C = 96, NH = 4, NKV = 2, C3 = C + 2 * NKV * (C / NH);
  const std::vector<int> begins = {0, 5, 6, 31, 32, 70, 149};
  std::vector<int> start(B * T, 0), pos(B * T);
  for (int t = 0; t < T; ++t) {
    for (int s : begins) start[t] = s <= t ? s : start[t];
    pos[t] = t - start[t];
    pos[T + t] = t;
  }
  Vec qkv = randn(B * T * C3, 1, 1), dout = randn(B * T * C, 1, 2);
  Vec out(B * T * C), lse(B * NH * T), dqkv(B * T * C3);
  auto d_qkv = up(qkv), d_dout = up(dout), d_out = up(out), d_lse = up(lse), d_dqkv = up(dqkv);
  auto d_start = up(start), d_pos = up(pos);
  attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH, NKV, start.data());
  gpu::attention_forward(d_out.data(), d_lse.data(), d_qkv.data(), B, T, C, NH, NKV, d_start.data());
  CHECK(rel_err(down(d_out), out) < kFp32);
  CHECK(rel_err(down(d_lse), lse) < kFp32);
  attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH, NKV, start.data());
  gpu::attention_backward(d_dqkv.data(), d_dout.data(), d_qkv.data(), d_out.data(), d_lse.data(), B, T, C, NH, NKV,
                          d_start.data());
  CHECK(rel_err(down(d_dqkv), dqkv) < kFp32);

  rope_forward(qkv.data(), B, T, C, NH, NKV, 10000.f, 0, pos.data());
  gpu::rope_forward(d_qkv.data(), B, T, C, NH, NKV, 10000.f, 0, d_pos.data());
  CHECK(rel_err(down(d_qkv), qkv) < kFp32);

  const int V = 11;
  auto tok = tokens(B * T, V, 3);
  Vec wte = randn(V * C, 1, 4), wpe = randn(T * C, 1, 5), emb(B * T * C), dwte(V * C, 0.f), dwpe(T * C, 0.f);
  auto d_tok = up(tok);
  auto d_wte = up(wte), d_wpe = up(wpe), d_emb = up(emb), d_dwte = up(dwte), d_dwpe = up(dwpe);
  encoder_forward(emb.data(), tok.data(), wte.data(), wpe.data(), B, T, C, 0, V, pos.data());
  gpu::encoder_forward(d_emb.data(), d_tok.data(), d_wte.data(), d_wpe.data(), B, T, C, 0, V, d_pos.data());
  CHECK(rel_err(down(d_emb), emb) == 0);
  encoder_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C, 0, V, pos.data());
  gpu::encoder_backward(d_dwte.data(), d_dwpe.data(), d_dout.data(), d_tok.data(), B, T, C, 0, V, d_pos.data());
  CHECK(down(d_dwpe) == dwpe);  // each position's rows in row order, as the CPU adds them
}

TEST_CASE("the llama family's RMSNorm, rotary embeddings and SwiGLU match the CPU", "[gpu]") {
  const int N = 263, C = 64, B = 1, NH = 4, NKV = 2, C3 = C + 2 * NKV * (C / NH), H = 45;
  Vec x = randn(N * C, 2, 1), w = randn(C, 1, 2), dout = randn(N * C, 1, 3), out(N * C), rstd(N);
  auto d_x = up(x), d_w = up(w), d_dout = up(dout), d_out = up(out), d_rstd = up(rstd);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
  gpu::rmsnorm_forward(d_out.data(), d_rstd.data(), d_x.data(), d_w.data(), N, C, 1e-5f);
  CHECK(rel_err(down(d_out), out) < kFp32);
  CHECK(rel_err(down(d_rstd), rstd) < kFp32);
  Vec dx = randn(N * C, 1, 4), dw = randn(C, 1, 5);  // both accumulate
  auto d_dx = up(dx), d_dw = up(dw);
  rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
  gpu::rmsnorm_backward(d_dx.data(), d_dw.data(), d_dout.data(), d_x.data(), d_w.data(), d_rstd.data(), N, C);
  CHECK(rel_err(down(d_dx), dx) < kFp32);
  CHECK(rel_err(down(d_dw), dw) < kFp32);
  Vec qkv = randn(N * C3, 1, 6);
  auto d_qkv = up(qkv);
  rope_forward(qkv.data(), B, N, C, NH, NKV, 10000.f, 5, nullptr);
  gpu::rope_forward(d_qkv.data(), B, N, C, NH, NKV, 10000.f, 5, nullptr);
  CHECK(rel_err(down(d_qkv), qkv) < kFp32);
  rope_backward(qkv.data(), B, N, C, NH, NKV, 10000.f, 5, nullptr);
  gpu::rope_backward(d_qkv.data(), B, N, C, NH, NKV, 10000.f, 5, nullptr);
  CHECK(rel_err(down(d_qkv), qkv) < kFp32);
  Vec gu = randn(N * 2 * H, 2, 7), act(N * H), dact = randn(N * H, 1, 8), dgu(N * 2 * H);
  auto d_gu = up(gu), d_act = up(act), d_dact = up(dact), d_dgu = up(dgu);
  swiglu_forward(act.data(), gu.data(), N, H);
  gpu::swiglu_forward(d_act.data(), d_gu.data(), N, H);
  CHECK(rel_err(down(d_act), act) < kFp32);
  swiglu_backward(dgu.data(), gu.data(), dact.data(), N, H);
  gpu::swiglu_backward(d_dgu.data(), d_gu.data(), d_dact.data(), N, H);
  CHECK(rel_err(down(d_dgu), dgu) < kFp32);
}

TEST_CASE("GELU, bias + GELU, residual, softmax cross-entropy match the CPU", "[gpu]") {
  const int N = 11, C = 45, V = 301;  // V > the 256 threads of a row
  Vec x = randn(N * C, 2, 1), bias = randn(C, 1, 2), dout = randn(N * C, 1, 3), y = randn(N * C, 1, 4);
  Vec out(N * C), pre = x, dinp = randn(N * C, 1, 7);  // dinp: overwritten
  auto d_x = up(x), d_bias = up(bias), d_dout = up(dout), d_y = up(y), d_out = up(out), d_pre = up(pre),
       d_dinp = up(dinp);
  gelu_forward(out.data(), x.data(), x.size());
  gpu::gelu_forward(d_out.data(), d_x.data(), x.size());
  CHECK(rel_err(down(d_out), out) < kFp32);
  Vec dbias(C, 0.5f);  // added to
  auto d_dbias = up(dbias);
  bias_gelu_backward(dinp.data(), dbias.data(), x.data(), bias.data(), dout.data(), N, C);
  gpu::bias_gelu_backward(d_dinp.data(), d_dbias.data(), d_x.data(), d_bias.data(), d_dout.data(), N, C);
  CHECK(rel_err(down(d_dinp), dinp) < kFp32);
  CHECK(rel_err(down(d_dbias), dbias) < kFp32);
  bias_gelu_forward(out.data(), pre.data(), bias.data(), N, C);
  gpu::bias_gelu_forward(d_out.data(), d_pre.data(), d_bias.data(), N, C);
  CHECK(down(d_pre) == pre);  // left as it was
  CHECK(rel_err(down(d_out), out) < kFp32);
  residual_forward(out.data(), x.data(), y.data(), bias.data(), N, C);
  gpu::residual_forward(d_out.data(), d_x.data(), d_y.data(), d_bias.data(), N, C);
  CHECK(rel_err(down(d_out), out) < kFp32);

  Vec logits = randn(N * V, 3, 5), probs(N * V), dlogits = randn(N * V, 1, 8);
  auto tgt = tokens(N, V, 6);
  auto d_logits = up(logits), d_probs = up(probs), d_dlogits = up(dlogits);
  auto d_tgt = up(tgt);
  const double loss = softmax_crossentropy_forward(probs.data(), logits.data(), tgt.data(), N, V);
  CHECK(gpu::softmax_crossentropy_forward(d_probs.data(), d_logits.data(), d_tgt.data(), N, V) ==
        Approx(loss).epsilon(1e-6));
  CHECK(rel_err(down(d_probs), probs) < kFp32);
  softmax_crossentropy_backward(dlogits.data(), probs.data(), tgt.data(), 0.25f, N, V, 0);
  gpu::softmax_crossentropy_backward(d_dlogits.data(), d_probs.data(), d_tgt.data(), 0.25f, N, V, 0);
  CHECK(rel_err(down(d_dlogits), dlogits) < kFp32);
}

TEST_CASE("the loss over a vocabulary part and the embedding of one match the CPU", "[gpu]") {
  // One tensor rank's part: vocabulary rows [5, 12) of 19; targets and tokens outside it too.
  const int N = 9, V = 7, v_begin = 5, C = 6;
  Vec logits = randn(N * V, 3, 11), probs(N * V), row_max(N), dlogits(N * V);
  auto tgt = tokens(N, 19, 12);
  std::vector<double> stats(2 * N);
  auto d_logits = up(logits), d_probs = up(probs), d_max = up(row_max), d_dlogits = up(dlogits);
  auto d_tgt = up(tgt);
  auto d_stats = up(stats);
  vocab_softmax_max(row_max.data(), logits.data(), N, V);
  gpu::vocab_softmax_max(d_max.data(), d_logits.data(), N, V);
  CHECK(rel_err(down(d_max), row_max) == 0);
  vocab_softmax_exp(probs.data(), stats.data(), logits.data(), row_max.data(), tgt.data(), N, V, v_begin);
  gpu::vocab_softmax_exp(d_probs.data(), d_stats.data(), d_logits.data(), d_max.data(), d_tgt.data(), N, V, v_begin);
  const std::vector<double> got = down(d_stats);
  for (int i = 0; i < 2 * N; ++i) CHECK(got[i] == Approx(stats[i]).epsilon(1e-6));
  const double loss = vocab_softmax_finish(probs.data(), row_max.data(), stats.data(), N, V);
  CHECK(gpu::vocab_softmax_finish(d_probs.data(), d_max.data(), d_stats.data(), N, V) == Approx(loss).epsilon(1e-6));
  CHECK(rel_err(down(d_probs), probs) < kFp32);
  softmax_crossentropy_backward(dlogits.data(), probs.data(), tgt.data(), 0.5f, N, V, v_begin);
  gpu::softmax_crossentropy_backward(d_dlogits.data(), d_probs.data(), d_tgt.data(), 0.5f, N, V, v_begin);
  CHECK(rel_err(down(d_dlogits), dlogits) < kFp32);

  Vec wte = randn(V * C, 1, 13), out(N * C), dwte(V * C, 0.f), dout = randn(N * C, 1, 14);
  auto d_wte = up(wte), d_out = up(out), d_dwte = up(dwte), d_dout = up(dout);
  encoder_forward(out.data(), tgt.data(), wte.data(), nullptr, 1, N, C, v_begin, V, nullptr);
  gpu::encoder_forward(d_out.data(), d_tgt.data(), d_wte.data(), nullptr, 1, N, C, v_begin, V, nullptr);
  CHECK(rel_err(down(d_out), out) == 0);
  encoder_backward(dwte.data(), nullptr, dout.data(), tgt.data(), 1, N, C, v_begin, V, nullptr);
  gpu::encoder_backward(d_dwte.data(), nullptr, d_dout.data(), d_tgt.data(), 1, N, C, v_begin, V, nullptr);
  CHECK(down(d_dwte) == dwte);
}

TEST_CASE("the mixture of experts' router, rows, combine and shared gate match the CPU", "[gpu]") {
  const int N = 67, E = 6, k = 2, C = 37, F = 29;  // N x k rows not a multiple of the warp
  const Vec logits = randn(N * E, 2, 1), x = randn(N * C, 1, 2), dout = randn(N * C, 1, 3);
  Vec probs(N * E), lse(N);
  auto d_logits = up(logits), d_probs = up(probs), d_lse = up(lse), d_x = up(x), d_dout = up(dout);
  router_softmax_forward(probs.data(), lse.data(), logits.data(), N, E);
  gpu::router_softmax_forward(d_probs.data(), d_lse.data(), d_logits.data(), N, E);
  CHECK(rel_err(down(d_probs), probs) < kFp32);
  CHECK(rel_err(down(d_lse), lse) < kFp32);
  gpu::router_softmax_forward(d_logits.data(), d_lse.data(), d_logits.data(), N, E);  // in place, as the stage runs it
  CHECK(rel_err(down(d_logits), probs) < kFp32);
  d_probs = up(probs);  // the CPU's, so both sides route alike

  for (bool dropless : {true, false}) {
    INFO((dropless ? "dropless, renormalised" : "capacity 0.5, unnormalised"));
    const bool norm_topk = dropless;
    MoeRouting r;
    // capacity 0.5: 6 experts of ceil(0.5 x 134 / 6) = 12 slots hold 72 of the 134: slots are dropped
    moe_route(r, probs.data(), N, E, k, norm_topk, moe_capacity(dropless ? 0 : 0.5, N, E, k));
    if (!dropless) REQUIRE(r.dropped() > 0);
    set_compute_device(Device::gpu);
    RoutedSlotsCopy copy;
    const RoutedSlots slots = copy.of(r);
    set_compute_device(Device::cpu);
    const int rows = r.rows();

    Vec xs(rows * C);
    auto d_xs = up(xs);
    moe_gather(xs.data(), x.data(), r, C);
    gpu::moe_gather(d_xs.data(), d_x.data(), slots, C);
    CHECK(down(d_xs) == xs);

    // The grouped products through each device's kernel table, down then up again.
    const Vec w = randn(E * F * C, 0.3f, 4), dy = randn(rows * F, 1, 5);
    Vec y(rows * F), dxs(rows * C), dw = randn(E * F * C, 1, 6);  // dw accumulates
    auto d_w = up(w), d_y = up(y), d_dy = up(dy), d_dxs = up(dxs), d_dw = up(dw);
    grouped_matmul_forward(kernels(Device::cpu), y.data(), xs.data(), w.data(), r.offsets.data(), E, C, F);
    grouped_matmul_forward(kernels(Device::gpu), d_y.data(), d_xs.data(), d_w.data(), r.offsets.data(), E, C, F);
    CHECK(rel_err(down(d_y), y) < kFp32);
    grouped_matmul_backward(kernels(Device::cpu), dxs.data(), dw.data(), dy.data(), xs.data(), w.data(),
                            r.offsets.data(), E, C, F);
    grouped_matmul_backward(kernels(Device::gpu), d_dxs.data(), d_dw.data(), d_dy.data(), d_xs.data(), d_w.data(),
                            r.offsets.data(), E, C, F);
    CHECK(rel_err(down(d_dxs), dxs) < kFp32);
    CHECK(rel_err(down(d_dw), dw) < kFp32);

    const Vec ye = randn(rows * C, 1, 7);
    for (bool accumulate : {false, true}) {
      Vec out = randn(N * C, 1, 8);
      auto d_ye = up(ye), d_out = up(out);
      moe_combine_forward(out.data(), ye.data(), r, C, accumulate);
      gpu::moe_combine_forward(d_out.data(), d_ye.data(), slots, C, accumulate);
      CHECK(rel_err(down(d_out), out) < kFp32);
    }
    for (int half = 0; half < 3; ++half) {  // 0: both, 1: rows only, 2: weights only
      INFO("half " << half);
      const bool want_rows = half != 2, want_weights = half != 1;
      Vec drows = randn(rows * C, 1, 9), dweight = randn(N * k, 1, 10);  // both overwritten
      auto d_ye = up(ye), d_drows = up(drows), d_dweight = up(dweight);
      moe_combine_backward(want_rows ? drows.data() : nullptr, want_weights ? dweight.data() : nullptr, dout.data(),
                           ye.data(), r, C);
      gpu::moe_combine_backward(want_rows ? d_drows.data() : nullptr, want_weights ? d_dweight.data() : nullptr,
                                d_dout.data(), d_ye.data(), slots, C);
      CHECK(rel_err(down(d_drows), drows) < kFp32);
      CHECK(rel_err(down(d_dweight), dweight) < kFp32);
    }
    Vec dx = randn(N * C, 1, 11);  // accumulates
    auto d_dx = up(dx), d_rowsgrad = up(ye);
    moe_scatter_add(dx.data(), ye.data(), r, C);
    gpu::moe_scatter_add(d_dx.data(), d_rowsgrad.data(), slots, C);
    CHECK(rel_err(down(d_dx), dx) < kFp32);

    const Vec dweight = randn(N * k, 1, 12);
    auto d_dweight = up(dweight);
    for (bool with_weights : {true, false}) {
      INFO((with_weights ? "with" : "without") << " the combine weights' gradient");
      Vec dlogits(N * E);
      auto d_dlogits = up(dlogits);
      router_backward(dlogits.data(), with_weights ? dweight.data() : nullptr, probs.data(), lse.data(), r, norm_topk,
                      0.3f, 0.05f);
      gpu::router_backward(d_dlogits.data(), with_weights ? d_dweight.data() : nullptr, d_probs.data(), d_lse.data(),
                           slots, norm_topk, 0.3f, 0.05f);
      CHECK(rel_err(down(d_dlogits), dlogits) < kFp32);
    }
  }

  // Qwen-MoE's shared-expert gate: the logits become sigmoids in place.
  const Vec shared = randn(N * C, 1, 13), gate_logits = randn(N, 2, 14);
  Vec gate = gate_logits, out(N * C), dshared(N * C), dgate(N), dlogit(N);
  auto d_shared = up(shared), d_gate = up(gate), d_out = up(out), d_dshared = up(dshared), d_dgate = up(dgate),
       d_dlogit = up(dlogit);
  shared_gate_forward(out.data(), gate.data(), shared.data(), N, C);
  gpu::shared_gate_forward(d_out.data(), d_gate.data(), d_shared.data(), N, C);
  CHECK(rel_err(down(d_gate), gate) < kFp32);
  CHECK(rel_err(down(d_out), out) < kFp32);
  shared_gate_backward(dshared.data(), dgate.data(), dout.data(), shared.data(), gate.data(), N, C);
  gpu::shared_gate_backward(d_dshared.data(), d_dgate.data(), d_dout.data(), d_shared.data(), d_gate.data(), N, C);
  CHECK(rel_err(down(d_dshared), dshared) < kFp32);
  CHECK(rel_err(down(d_dgate), dgate) < kFp32);
  sigmoid_backward(dlogit.data(), dgate.data(), gate.data(), N);
  gpu::sigmoid_backward(d_dlogit.data(), d_dgate.data(), d_gate.data(), N);
  CHECK(rel_err(down(d_dlogit), dlogit) < kFp32);
}

TEST_CASE("the RMSNorm over tensor-split q and k rows (model.qk_norm) matches the CPU", "[gpu]") {
  // This rank's 40 columns of rows 72 floats apart (the raw q and k), written into rows 96 apart (qkv)
  const int N = 263, width = 40, x_stride = 72, y_stride = 96, whole = 120;
  const Vec x = randn(N * x_stride, 2, 1), w = randn(width, 1, 2), dy = randn(N * y_stride, 1, 3);
  Vec ss(N), y = randn(N * y_stride, 1, 4), rstd(N), dot(N);
  auto d_x = up(x), d_w = up(w), d_ss = up(ss), d_y = up(y), d_rstd = up(rstd), d_dot = up(dot);
  split_rms_squares(ss.data(), x.data(), N, width, x_stride);
  gpu::split_rms_squares(d_ss.data(), d_x.data(), N, width, x_stride);
  CHECK(rel_err(down(d_ss), ss) < kFp32);
  d_ss = up(ss);
  split_rms_forward(y.data(), rstd.data(), x.data(), ss.data(), w.data(), N, width, x_stride, y_stride, whole, 1e-6f);
  gpu::split_rms_forward(d_y.data(), d_rstd.data(), d_x.data(), d_ss.data(), d_w.data(), N, width, x_stride, y_stride,
                         whole, 1e-6f);
  CHECK(rel_err(down(d_y), y) < kFp32);  // the columns between the rows untouched too
  CHECK(rel_err(down(d_rstd), rstd) < kFp32);
  auto d_dy = up(dy);
  split_rms_dots(dot.data(), dy.data(), x.data(), w.data(), N, width, x_stride, y_stride);
  gpu::split_rms_dots(d_dot.data(), d_dy.data(), d_x.data(), d_w.data(), N, width, x_stride, y_stride);
  CHECK(rel_err(down(d_dot), dot) < kFp32);
  d_dot = up(dot);
  for (int half = 0; half < 3; ++half) {  // 0: both (dx in place of dy, as the stage runs it), 1: input, 2: weight
    INFO("half " << half);
    const bool input = half != 2, weight = half != 1;
    Vec dx = dy, dw = randn(width, 1, 5);  // dw accumulates
    auto d_dx = up(dy), d_dw = up(dw);
    split_rms_backward(input ? dx.data() : nullptr, weight ? dw.data() : nullptr, dx.data(), x.data(), w.data(),
                       rstd.data(), dot.data(), N, width, x_stride, y_stride, whole, 0.5f);
    gpu::split_rms_backward(input ? d_dx.data() : nullptr, weight ? d_dw.data() : nullptr, d_dx.data(), d_x.data(),
                            d_w.data(), d_rstd.data(), d_dot.data(), N, width, x_stride, y_stride, whole, 0.5f);
    CHECK(rel_err(down(d_dx), dx) < kFp32);
    CHECK(rel_err(down(d_dw), dw) < kFp32);
  }
}

TEST_CASE("AdamW update and the squared gradient norm match the CPU", "[gpu]") {
  RunSpec::Train cfg;
  cfg.weight_decay = 0.1;
  const size_t n = 1000;
  ParamTensor p;
  p.name = "h.0.mlp.c_fc.weight", p.shape = {40, 25}, p.size = n, p.decay = true;
  Vec w = randn(n, 1, 1), g = randn(n, 1, 2);
  AdamW adam(cfg, OptimizerShard({p}, 0, 1));  // on the CPU: the compute device is the CPU here
  Array<float> cpu_w, cpu_g;
  cpu_w.assign(w.data(), n), cpu_g.assign(g.data(), n);
  auto d_w = up(w), d_g = up(g), d_m = up(Vec(n)), d_v = up(Vec(n));
  const double lr = 1e-3;
  for (int t = 1; t <= 3; ++t) {  // three steps: the bias corrections change
    adam.step({p}, cpu_w, cpu_g, lr, 0.5f);
    const double bc1 = 1 - std::pow(cfg.beta1, t), bc2 = 1 - std::pow(cfg.beta2, t);
    gpu::adamw_update(d_w.data(), d_g.data(), d_m.data(), d_v.data(), n, float(cfg.beta1), float(cfg.beta2),
                      float(lr / bc1), float(1 / std::sqrt(bc2)), float(cfg.eps), float(1 - lr * cfg.weight_decay),
                      0.5f);
  }
  CHECK(rel_err(down(d_w), cpu_w.to_host()) < kFp32);
  CHECK(rel_err(down(d_m), adam.exp_avg().to_host()) < kFp32);
  CHECK(rel_err(down(d_v), adam.exp_avg_sq().to_host()) < kFp32);
  double sq = 0;
  for (float x : g) sq += double(x) * x;
  CHECK(gpu::sum_of_squares(d_g.data(), n) == Approx(sq).epsilon(1e-12));
}

namespace {

struct StageResult {
  double loss = 0;
  Vec out, dinp, grads;
};

// Micro-batches 0..M-1 of one stage, forward then backward (fused or split), on the device chosen
// now: the same inputs, results brought back to the host.
StageResult run_stage(const RunSpec& spec, int stage, int n_stages, int b0, int b1, bool split) {
  const int M = spec.parallel.micro_batches, N = spec.samples_per_micro_batch() * spec.model.seq_len;
  const int C = spec.model.d_model, V = spec.model.vocab;
  Stage st(spec, stage, n_stages, b0, b1, M, 1.f / (N * M));
  st.init_params(11);
  st.zero_grads();
  Array<float> out(static_cast<size_t>(N) * C), dinp(static_cast<size_t>(N) * C), dout(static_cast<size_t>(N) * C);
  StageResult r;
  for (int mb = 0; mb < M; ++mb) {
    auto tok = tokens(N, V, 20 + mb), tgt = tokens(N, V, 30 + mb);
    if (st.has_embedding()) st.set_tokens(mb, tok.data());
    if (st.has_head()) st.set_targets(mb, tgt.data());
    if (!st.has_embedding()) {
      Vec x = randn(static_cast<size_t>(N) * C, 1, 40 + mb);
      upload(st.input_buffer(0, mb), x.data(), sizeof(float) * x.size());
    }
    r.loss += st.forward(0, mb, st.has_head() ? nullptr : out.data());
    if (!st.has_head()) {
      auto o = out.to_host();
      r.out.insert(r.out.end(), o.begin(), o.end());
    }
  }
  for (int mb = M - 1; mb >= 0; --mb) {
    Vec g = randn(static_cast<size_t>(N) * C, 1, 50 + mb);
    dout.assign(g.data(), g.size());
    const float* d = st.has_head() ? nullptr : dout.data();
    float* di = st.has_embedding() ? nullptr : dinp.data();
    if (split) st.backward_input(0, mb, d, di), st.backward_weight(0, mb);
    else st.backward(0, mb, d, di);
    if (di) {
      auto x = dinp.to_host();
      r.dinp.insert(r.dinp.end(), x.begin(), x.end());
    }
  }
  r.grads = st.grads().to_host();
  return r;
}

}  // namespace

TEST_CASE("whole stages on the GPU match the CPU: loss, output, input and parameter gradients", "[gpu]") {
  RunSpec spec;
  spec.model.n_layer = 4, spec.model.d_model = 64, spec.model.n_head = 4, spec.model.seq_len = 33;
  spec.model.vocab = 97, spec.train.global_batch = 4, spec.parallel.micro_batches = 2;
  struct Case {
    int stage, n_stages, b0, b1;
    const char* recompute;
    bool split, tied, llama;
    bool moe = false, qk_norm = false;
    double capacity = 0;  // model.moe.capacity_factor
  };
  for (const Case& c : {Case{0, 1, 0, 4, "none", false, true, false}, Case{0, 1, 0, 4, "none", true, false, false},
                        Case{1, 3, 1, 3, "block", false, true, false}, Case{2, 3, 3, 4, "stage", false, true, false},
                        Case{0, 3, 0, 1, "none", true, true, false}, Case{0, 1, 0, 4, "none", false, false, true},
                        Case{1, 3, 1, 3, "none", true, false, true}, Case{2, 3, 3, 4, "stage", false, true, true},
                        // every block an MoE block, with QK-norm and a gated shared expert: whole, split,
                        // recomputed, and the head's stage
                        Case{0, 1, 0, 4, "none", false, false, true, true, true},
                        Case{1, 3, 1, 3, "block", true, false, true, true, true, 0.5},  // slots dropped
                        Case{2, 3, 3, 4, "stage", false, true, true, true, false}}) {
    INFO("stage " << c.stage << "/" << c.n_stages << " recompute " << c.recompute << (c.split ? " split" : "")
                  << (c.tied ? " tied" : " untied") << (c.llama ? " llama" : " gpt2") << (c.moe ? " moe" : "")
                  << (c.qk_norm ? " qk_norm" : ""));
    spec.parallel.recompute = *choice_named<Recompute>(c.recompute);
    spec.model.tie_embeddings = c.tied;
    spec.model.arch = c.llama ? Arch::llama : Arch::gpt2;
    spec.model.n_kv_head = c.llama ? 2 : 0;  // grouped: 2 query heads per key/value head
    spec.model.ffn_hidden = c.llama ? 96 : 0;
    spec.model.qk_norm = c.qk_norm;
    RunSpec::Model::Moe& moe = spec.model.moe;
    moe.experts = c.moe ? 4 : 0, moe.top_k = 2, moe.ffn_hidden = 40, moe.z_loss = c.moe ? 1e-3 : 0;
    moe.shared_experts = c.moe ? 1 : 0, moe.shared_ffn_hidden = c.moe ? 24 : 0, moe.shared_gate = c.moe;
    moe.capacity_factor = c.capacity;
    set_compute_device(Device::cpu);
    const StageResult cpu = run_stage(spec, c.stage, c.n_stages, c.b0, c.b1, c.split);
    set_compute_device(Device::gpu);
    const StageResult gpu = run_stage(spec, c.stage, c.n_stages, c.b0, c.b1, c.split);
    set_compute_device(Device::cpu);
    CHECK(gpu.loss == Approx(cpu.loss).epsilon(1e-5));
    CHECK(rel_err(gpu.out, cpu.out) < 1e-4);
    CHECK(rel_err(gpu.dinp, cpu.dinp) < 1e-4);
    CHECK(rel_err(gpu.grads, cpu.grads) < 1e-4);
  }
}

// One kernel on the GPU, waited for: what scripts/gpu/check.sh runs under compute-sanitizer first,
// to learn whether the sanitizer can drive this machine's GPU at all.
int probe() {
  gpu::Buffer<float> x(256), y(256);
  gpu::zero(x.data(), sizeof(float) * 256);
  gpu::gelu_forward(y.data(), x.data(), 256);
  gpu::synchronize();
  std::printf("GPU probe: one kernel ran\n");
  return 0;
}

// --gpu-info: only says what the GPUs are (the GPU check's first lines), without testing;
// --gpu-probe: runs one kernel (probe()).
int main(int argc, char** argv) {
  const bool info_only = argc > 1 && std::strcmp(argv[1], "--gpu-info") == 0;
  const bool probe_only = argc > 1 && std::strcmp(argv[1], "--gpu-probe") == 0;
  try {
    const int n = gpu::device_count();
    if (n == 0) {
      std::printf("no GPU visible%s\n", info_only || probe_only ? "" : ": GPU kernel tests skipped");
      return 77;  // SKIP_RETURN_CODE in tests/CMakeLists.txt
    }
    for (int d = 0; d < (info_only ? n : 1); ++d) {
      const gpu::DeviceInfo info = gpu::device_info(d);
      std::printf("GPU %d: %s\n", d, gpu::describe(info).c_str());
      if (info_only) std::printf("  MFU's peak: %s\n", gpu::peak_basis(info, Dtype::bf16).c_str());
    }
    if (info_only) return 0;
    gpu::select_device(0);
    if (probe_only) return probe();
  } catch (const std::exception& e) {  // a GPU that is there but unusable fails, never skips
    std::fprintf(stderr, "GPU kernel tests: %s\n", e.what());
    return 1;
  }
  return Catch::Session().run(argc, argv);
}
