// The GPT slice one rank owns: one chunk of contiguous blocks (several under the interleaved
// schedule, see partition.hpp), plus the embeddings on the first virtual stage and the final
// norm + LM head + loss on the last. Both model families (gpt2, llama: block_tensors.hpp) run
// the same layer code; where they differ (the norm, rotary positions, the MLP's activation) a
// layer asks the family. Stage is the passes the executor calls around its parts, each in its own
// file: the parameters (param_store.hpp), the micro-batches' buffers (activation_pool.hpp), what
// every layer holds, exchanges and computes (layer_decl.hpp), the block (stage_layers.cpp), the
// head and loss (stage_head.cpp) and generation (stage_generation.cpp).
//
// Activations: forward(chunk, mb) computes one micro-batch and keeps what the recompute mode says
// until its backward: none = everything backward needs; block = each block's input (blocks are re-run
// one at a time in backward); stage = only the stage input (the whole stage is re-run).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "pipetrain/compute/array.hpp"
#include "pipetrain/compute/moe_kernels.hpp"
#include "pipetrain/compute/ops.hpp"
#include "pipetrain/config/spec.hpp"
#include "pipetrain/model/activation_pool.hpp"
#include "pipetrain/model/block_tensors.hpp"
#include "pipetrain/model/documents.hpp"
#include "pipetrain/model/expert_parallel.hpp"
#include "pipetrain/model/layer_decl.hpp"
#include "pipetrain/model/param_store.hpp"
#include "pipetrain/model/partition.hpp"
#include "pipetrain/model/stage_memory.hpp"
#include "pipetrain/model/tensor_parallel.hpp"

namespace pipetrain {

// Keys and values of the tokens one sequence has run so far, per block ([seq_len, KV] each: the
// key/value heads only), so that generation runs only its new tokens through the model
// (Stage::forward_cached).
struct KvCache {
  int pos = 0;       // positions cached
  int document = 0;  // where the document open at pos began (document masking)
  std::vector<Floats> k, v;
};

// Where a pass's weights come from when a stage does not hold them all (ZeRO-3:
// train/param_fetch.hpp gathers them): the Stage calls fetch before a layer's pass reads its
// weights and done after it, and reads each tensor where the fetcher put it (`where`, the tensor's
// offset in the flat buffers). Layers of a chunk are numbered in buffer order: 0 the embedding (on
// the first virtual stage), 1..L its blocks, L + 1 the head (on the last). The passes that only
// add weight gradients (the embedding's backward, a split backward's W) read no weights.
class WeightFetcher {
 public:
  enum class Pass { forward, backward };
  virtual ~WeightFetcher() = default;
  virtual void fetch(int chunk, int layer, Pass pass) = 0;
  virtual void done(int chunk, int layer, Pass pass) = 0;
  virtual float* where(size_t offset) = 0;
};

// What an MoE block's router did over the micro-batches a stage ran forward since last asked
// (Stage::take_moe_figures): the slots choosing each expert, the slots capacity dropped, and the
// sums of its micro-batches' load-balancing and z losses (moe_kernels.hpp).
struct MoeBlockFigures {
  std::vector<double> chosen;
  double dropped = 0, aux_loss = 0, z_loss = 0;
  int micro_batches = 0;
};

class Stage {
 public:
  // Owns `chunks`, virtual stages out of `n_virtual`, for `micro_batches` micro-batches;
  // `grad_scale` = dLoss/d(token loss) = 1 / (tokens per micro-batch x M x dp). As tensor rank
  // `tp` it holds its part of each tensor (tensor_parallel.hpp) and, when the group has more than
  // one rank, runs no pass before set_tensor_group; as expert-parallel rank `ep` it holds its part of
  // each MoE block's experts (expert_parallel.hpp) and, with more than one, runs no pass before
  // set_expert_group.
  Stage(const RunSpec& spec, const std::vector<ChunkRange>& chunks, int n_virtual, int micro_batches, float grad_scale,
        TpPart tp = {}, TpPart ep = {});
  // One chunk: global blocks [block_begin, block_end) as stage `stage` out of `n_stages`.
  Stage(const RunSpec& spec, int stage, int n_stages, int block_begin, int block_end, int micro_batches,
        float grad_scale, TpPart tp = {}, TpPart ep = {});
  // The collectives over this stage's tensor group; it must outlive the Stage's passes.
  void set_tensor_group(TensorGroup* group) { group_ = group; }
  // The all-to-alls over its expert group; it must outlive the Stage's passes.
  void set_expert_group(ExpertGroup* group) { experts_ = group; }
  // Where weights come from when the stage does not hold them all (null: it does); it must outlive
  // the Stage's passes.
  void set_weight_fetcher(WeightFetcher* fetcher) { fetcher_ = fetcher; }
  // The tensors a layer's pass reads (WeightFetcher's numbering): a block's, the embedding's, or
  // the head's (its final norm and its matrix, wte itself where a tied head shares the rank).
  std::vector<const ParamTensor*> layer_params(int chunk, int layer) const;
  int layers(int chunk) const { return chunks_[chunk].L + 2; }
  const TpPart& tp() const { return tp_; }

  int chunks() const { return static_cast<int>(chunks_.size()); }
  bool first(int chunk) const { return chunks_[chunk].first; }  // virtual stage 0: embeddings
  bool last(int chunk) const { return chunks_[chunk].last; }    // the last virtual stage: head and loss
  bool has_embedding() const { return chunks_.front().first; }
  bool has_head() const { return chunks_.back().last; }
  size_t chunk_offset(int chunk) const { return chunks_[chunk].offset; }  // its first tensor in the flat buffers
  // One activation between stages: the micro-batch's token rows this rank keeps x d_model.
  size_t boundary_floats() const { return static_cast<size_t>(kept_rows(B_ * T_)) * C_; }

  const std::vector<ParamTensor>& params() const { return store_.params(); }
  Floats& weights() { return store_.weights(); }
  Floats& grads() { return store_.grads(); }
  const ParamTensor* find(const std::string& name) const { return store_.find(name); }
  void init_params(uint64_t seed) { store_.init(seed); }  // deterministic per name: same weights on any layout
  void zero_grads() { store_.zero_grads(); }
  void release_grads() { store_.release_grads(); }
  void drop_weights() { store_.drop_weights(); }

  // Inputs of micro-batch mb: tokens (first virtual stage), targets (last), or the buffer the
  // previous virtual stage's activation is received into (other chunks; valid until backward).
  void set_tokens(int mb, const int* tokens);
  void set_targets(int mb, const int* targets);
  // Document masking (documents.hpp): every virtual stage then needs micro-batch mb's tokens
  // (set_documents, before its first forward) to know where its documents begin.
  void set_document_mask(const DocumentMask& mask) { mask_ = mask; }
  bool masks_documents() const { return mask_.on(); }
  void set_documents(int mb, const int* tokens);
  float* input_buffer(int chunk, int mb);

  // Runs micro-batch mb through one chunk. Returns the summed token loss on the last virtual stage
  // (0 elsewhere, and on a tensor group's other ranks, so that sums over ranks count it once); other chunks write their
  // output activation to `out` (boundary_floats()).
  double forward(int chunk, int mb, float* out);
  // `dout`: gradient of the chunk's output (not on the last virtual stage); writes the input
  // gradient to `dinp` (not on the first). Parameter gradients accumulate. Releases the stash.
  // `done_from`, if given, is called as parameters' gradients receive their last contribution of
  // this backward, with the buffer offset from which all gradients are now complete (it only
  // falls: the layout runs embeddings, blocks, head, and backward visits them in reverse).
  void backward(int chunk, int mb, const float* dout, float* dinp,
                const std::function<void(size_t)>& done_from = nullptr);
  // The same backward in two halves (recompute = none only): backward_input computes the input
  // gradient (sent on at once) and keeps the output gradients the parameters need; backward_weight,
  // possibly much later, adds the parameter gradients and releases the stash. Together they give
  // the same bits as backward().
  void backward_input(int chunk, int mb, const float* dout, float* dinp);
  void backward_weight(int chunk, int mb, const std::function<void(size_t)>& done_from = nullptr);
  // Softmax probabilities [tokens, vocab] of micro-batch mb's last forward on the head, kept until
  // its backward or discard; recompute = none only (other modes do not keep them).
  const Floats& head_probs(int mb) { return pool_.stash(chunks() - 1, mb).head.probs; }
  // Generation, on a stage holding the whole model on the CPU: runs n new tokens of one sequence at
  // positions cache.pos .. through the same layers as forward(), their attention over the cached
  // keys and values (which they join); probs [n, vocab]: each position's next-token distribution.
  void forward_cached(const int* tokens, int n, KvCache& cache, float* probs);
  // Drops what a forward kept (an evaluation has no backward).
  void discard(int chunk, int mb) {
    if (pool_.holds(chunk, mb)) pool_.release(chunk, mb);
  }
  // What micro-batch mb holds on `chunk`: its activations and, between a split B and its W, the
  // output gradients.
  size_t stash_bytes(int chunk, int mb) const;
  // Bytes of its per-pass buffers right now (stage_scratch_bytes predicts their peak): scratch,
  // a fused backward's output gradients, the loss's sums, the recompute work area.
  size_t scratch_bytes() const;
  // The messages this stage has sent its tensor group since it was built, by kind (Exchange in
  // layer_decl.hpp, which declares what each pass sends).
  const Messages& messages_sent() const { return sent_; }
  // Seconds the last backward() spent re-running forwards (recompute modes), for the trace.
  double last_recompute_s() const { return recompute_s_; }
  // Each of its MoE blocks' routing since the last call (by global block index), counted once per
  // micro-batch's forward (recompute's forwards and generation not counted); then cleared.
  std::map<int, MoeBlockFigures> take_moe_figures() { return std::exchange(moe_figures_, {}); }
  // Called after each matrix product and attention kernel, the head's included (the executor keeps
  // messages moving there: a rendezvous over TCP or RDMA advances only when its ranks look, so the
  // finer the calls, the less a transfer waits on the compute around it).
  void set_poll(std::function<void()> f) { poll_ = std::move(f); }

 private:
  struct Chunk {
    int L;             // blocks
    int block_begin;   // the global index of its first
    bool first, last;  // virtual stage 0 / the last one
    size_t offset;     // of its first tensor in the flat buffers
    std::vector<size_t> block_offset;
  };
  // The tokens a forward runs: a micro-batch (B_ sequences of T_), or T new tokens of one sequence
  // whose earlier keys and values are in `cache` (generation).
  struct Tokens {
    int B, T;
    KvCache* cache = nullptr;
    const int* doc_start = nullptr;  // [B, T] under document masking, else null (layer_kernels.hpp)
    const int* pos = nullptr;        // [B, T] where positions are not t
    int rows() const { return B * T; }
  };
  Tokens micro_batch() const { return {B_, T_}; }
  Tokens micro_batch(int mb) const;  // with its documents' starts and positions
  // The rows the declared buffers have for `tok` (generation keeps no attention statistics).
  LayerRows rows_of(const Tokens& tok) const {
    return {static_cast<size_t>(tok.rows()), static_cast<size_t>(kept_rows(tok.rows())),
            tok.cache ? 0 : static_cast<size_t>(tok.B) * shape_.NH * tok.T};
  }
  LayerRows batch_rows() const { return rows_of(micro_batch()); }
  BlockPtrs block_ptrs(Floats& base, const Chunk& c, int local_block);
  void size_acts(const Chunk& c, Acts& a, const Tokens& tok);
  void compute_forward(const Chunk& c, Acts& w, const Acts& s, float* out, double* loss, const Tokens& tok);
  void block_forward(const Chunk& c, int l, const float* x, BlockActs& a, float* out, const Tokens& tok);
  // Which part of a backward a pass runs: both halves at once (each kernel does both in one pass,
  // with one scratch set of output gradients), or the input-gradient half (B) or the weight half
  // (W) alone, the output gradients kept in the micro-batch's slot between them (recompute = none).
  enum class BackwardPart { whole, input, weight };
  void backward_pass(int chunk, int mb, const float* dout, float* dinp, BackwardPart part,
                     const std::function<void(size_t)>& done_from);
  Acts& activations_for_backward(const Chunk& c, Acts& s, const Tokens& tok);
  WGrads& kept_wgrads(const Chunk& c, int chunk, int mb, bool size_them);
  void head_backward(const Chunk& c, const Acts& s, Acts& a, HeadWGrads& hw, BackwardPart part);
  void block_backward(const Chunk& c, int l, Acts& a, BlockWGrads& w, BackwardPart part, const Tokens& tok);
  void block_backward_input(const Chunk& c, int l, const float* x, const BlockActs& a, const float* dout, float* dinp,
                            BlockWGrads& w, const BlockPtrs* fused_grads, const Tokens& tok);
  void block_backward_weight(const Chunk& c, int l, const float* x, const BlockActs& a, const BlockWGrads& w);
  double head_forward(const float* x, HeadActs& a, const int* targets, const Tokens& tok);
  void head_backward_input(const float* x, const HeadActs& a, const int* targets, float* dinp, HeadWGrads& w,
                           bool fused);
  void head_backward_weight(const float* x, const HeadActs& a, const HeadWGrads& w);
  // The layers where the families differ: LayerNorm or RMSNorm, GELU or SwiGLU.
  void norm_forward(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b, int N);
  void norm_backward(float* dinp, float* dw, float* db, const float* dout, const float* x, const float* w,
                     const float* mean, const float* rstd, int N);
  void mlp_activation_forward(BlockActs& a, const float* fcb, int N);
  // model.qk_norm: q and k of qkv's N rows RMS-normalised over all heads (the tensor group sums each
  // row's partial sums), the raw q and k and their 1/rms kept in `a`. Backward: qkv's q and k
  // gradients (dqkv) in place through the norms; the weights' gradients into `dw` where given, else
  // (a split backward's input half) the normalised rows' gradients kept in `keep`.
  void qk_norm_forward(BlockActs& a, const float* w, int N);
  void qk_norm_backward(const BlockActs& a, float* dqkv, float* dw, const float* w, float* keep, int N);
  // Its two partial row sums (q's, then k's: 2N floats) summed over the tensor group.
  void sum_qk_partials(float* sums, int N);
  void mlp_activation_backward(float* dfch, float* dfcb, const BlockActs& a, const float* fcb, const float* dact,
                               int N);
  // An MoE block's MLP (stage_moe.cpp): x its input's whole rows, out its output (partial under tp).
  bool is_moe(const Chunk& c, int l) const { return moe_.block_is_moe(c.block_begin + l); }
  const BlockShape& shape_of(const Chunk& c, int l) const { return is_moe(c, l) ? moe_shape_ : shape_; }
  const LayerWidths& widths_of(const Chunk& c, int l) const { return is_moe(c, l) ? moe_widths_ : widths_; }
  // Routes the N tokens by the router's probabilities kept in `a` (on the GPU brought to the host).
  void route(const BlockActs& a, int N);
  // Expert parallelism: the routing's rows [rows, width] in `buf` to their experts' ranks (this
  // rank's experts' rows then fill buf; `planned`: the routing's counts already exchanged in this
  // pass), or back; nothing at ep 1. The offsets and the number of the rows this rank's experts run.
  void send_to_experts(Floats& buf, int width, bool planned = false);
  void back_from_experts(Floats& buf, int width);
  const int* expert_offsets() const { return ep_.size > 1 ? dispatch_.offsets() : routing_.offsets.data(); }
  int expert_rows() const { return ep_.size > 1 ? dispatch_.rows() : routing_.rows(); }
  void moe_forward(BlockActs& a, const BlockPtrs& w, const float* x, float* out, int N, int block);
  void moe_backward_input(const BlockActs& a, BlockWGrads& w, const BlockPtrs* g, const BlockPtrs& p, const float* dout,
                          const float* ln2, float* dx, int N);
  void moe_backward_weight(const BlockActs& a, const BlockWGrads& w, const BlockPtrs& g, const float* x, int N);
  void record_routes(int block, const BlockActs& a);
  // The loss of the head's logits, whole or (tensor ranks) a part of the vocabulary.
  double softmax_loss(HeadActs& a, const int* targets, int N);
  // Sequence parallelism (tensor_parallel.hpp): of a micro-batch's N token rows this rank keeps
  // kept_rows(N) of the residual stream and the norms; the other layers see all N.
  int kept_rows(int N) const { return sp_ ? N / tp_.size : N; }
  // The whole [N, C] of the rows this rank keeps: all-gathered into gathered_ with sequence
  // parallelism, else `kept` itself.
  const float* whole_rows(const float* kept, int N);
  // whole_rows for a weight gradient's input: none is needed where the pass computes no weight
  // gradients (the input half of a split backward), so nothing is gathered.
  const float* whole_rows_if(bool needed, const float* kept, int N) { return needed ? whole_rows(kept, N) : nullptr; }
  // A row-parallel product's partial output, or a split product's partial input gradient, [N, C],
  // summed over the tensor group: in place, or with sequence parallelism reduce-scattered, this
  // rank's rows into `kept`. Returns the summed rows this rank keeps.
  const float* sum_partials(float* partial, int N, float* kept);
  // Where a split product writes the partial input gradient that sum_partials makes `kept`.
  float* partial_target(float* kept) { return sp_ ? scratch_.dpartial.data() : kept; }
  // A tensor of `base` (weights_ or grads_) at `offset`; null where the family has none.
  static constexpr size_t kAbsent = ParamStore::kAbsent;
  float* tensor(Floats& base, size_t offset) { return offset == kAbsent ? nullptr : base.data() + offset; }
  // A tensor's weights as a pass reads them: in the flat buffer, or where the WeightFetcher put
  // them; null where the family has none.
  float* weight(size_t offset) {
    return offset == kAbsent ? nullptr : fetcher_ ? fetcher_->where(offset) : store_.weights().data() + offset;
  }
  BlockPtrs block_weights(const Chunk& c, int local_block);

  std::vector<Chunk> chunks_;
  int M_, B_, T_, C_;
  TpPart tp_;
  bool sp_;  // sequence parallelism
  TensorGroup* group_ = nullptr;
  TpPart ep_;  // expert parallelism
  ExpertGroup* experts_ = nullptr;
  ExpertDispatch dispatch_;
  WeightFetcher* fetcher_ = nullptr;
  using Pass = WeightFetcher::Pass;
  void fetch(const Chunk& c, int layer, Pass pass) {
    if (fetcher_) fetcher_->fetch(index_of(c), layer, pass);
  }
  void done(const Chunk& c, int layer, Pass pass) {
    if (fetcher_) fetcher_->done(index_of(c), layer, pass);
  }
  int index_of(const Chunk& c) const { return static_cast<int>(&c - chunks_.data()); }
  int v_begin_, V_;       // the vocabulary rows this rank holds: [v_begin_, v_begin_ + V_)
  BlockShape shape_;      // this rank's part of a block's widths
  LayerWidths widths_;    // the same, and its vocabulary rows, for the declared buffers
  BlockShape moe_shape_;  // an MoE block's (model.moe; the dense shape_ without experts)
  LayerWidths moe_widths_;
  RunSpec::Model::Moe moe_;
  MoeRouting routing_;            // the MoE block's being run, made on the host
  std::vector<float> routed_by_;  // on the GPU: the router's probabilities it was made from, downloaded
  RoutedSlotsCopy slots_copy_;
  RoutedSlots slots_;  // routing_ where the kernels read it
  bool recording_routes_ = false;
  std::map<int, MoeBlockFigures> moe_figures_;
  float rope_theta_, norm_eps_;
  // model.qk_norm: the whole q's and k's widths, and how many tensor ranks hold each key/value head.
  int q_whole_, kv_whole_, kv_copies_;
  bool tied_;
  Recompute mode_;
  float grad_scale_;
  double recompute_s_ = 0;
  std::function<void()> poll_;
  void poll() {
    if (poll_) poll_();
  }
  const Kernels& k_;  // the compute device's kernels
  ParamStore store_;
  size_t wte_ = 0, wpe_ = kAbsent, lnfw_ = 0, lnfb_ = kAbsent, head_ = 0;

  ActivationPool pool_;  // the micro-batches' buffers between their forward and backward
  DocumentMask mask_;
  struct Documents {  // a micro-batch's, [B, T] each
    Array<int> start, pos;
  };
  std::vector<Documents> documents_;  // per micro-batch, under document masking
  Acts work_;                         // recompute target when mode != none
  Acts generation_;                   // forward_cached's activations
  Messages sent_{};
  void count_sent(Exchange kind, size_t bytes) {
    sent_[static_cast<int>(kind)].calls += 1;
    sent_[static_cast<int>(kind)].bytes += bytes;
  }
  StageScratch scratch_;         // one micro-batch's, as layer_decl.hpp declares it
  Array<double> softmax_stats_;  // a split vocabulary's sums of exponentials and target logits
  BlockWGrads wscratch_;         // a fused backward's output gradients, one block at a time
  HeadWGrads hscratch_;
};

}  // namespace pipetrain
