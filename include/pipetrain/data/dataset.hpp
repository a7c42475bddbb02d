// Token streams and the deterministic sample order every rank agrees on (docs/design.md, "Data order").
//
// Global sample k of step s covers the T+1 tokens starting at ((s*B + k)*T) mod (N - T - 1) when
// data.shuffle = false. With shuffle = true the stream is cut into E = floor((N-T-1)/T) windows of
// stride T and g = s*B + k picks window perm_e[g mod E] of epoch e = g / E, perm_e a seeded
// permutation. DP rank r takes global samples [r*B/D, (r+1)*B/D) of the step, and micro-batch j
// of that rank the j-th consecutive B/(D*M) of them.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pipetrain/config/spec.hpp"
#include "pipetrain/data/mixture.hpp"
#include "pipetrain/data/token_file.hpp"

namespace pipetrain {

// The built-in learnable byte language: sentences of words drawn from a seeded vocabulary with
// seeded word-to-word transitions, so a model first learns spelling, then likely next words.
// Another `stream` draws other sentences of the same language (held-out text).
std::vector<uint8_t> synthetic_corpus(uint64_t seed, size_t n_bytes, uint64_t stream = 0);

// Which tokens a Dataset serves (Split, token_file.hpp): the training stream, or held-out
// validation tokens (the token file's /val, or other sentences of the synthetic language), read in
// order without shuffling.
class Dataset {
 public:
  static constexpr size_t kSyntheticBytes = 1 << 20, kSyntheticValBytes = 1 << 16;

  // Loads data.source for `split` (hdf5: opens the token file's /train or /val and reads windows
  // as needed; data.sources: the mixture, mixture.hpp); an unreadable, too-short or mismatched
  // file is a SpecError naming data.path (data.sources[i]).
  explicit Dataset(const RunSpec& spec, Split split = Split::train);
  ~Dataset();

  size_t n_tokens() const { return file_ ? file_->size() : tokens_.size(); }  // (not of a mixture)
  // Why the first `samples` global samples would not all be different windows ("" when they are):
  // held-out data must not repeat.
  std::string repeats_within(int64_t samples) const;
  Mixture* mixture() { return mixture_.get(); }
  // A mixture's validation per source: from here on global sample g is source s's sample g (-1:
  // the mixture's again). whole_batches(s): the global batches of it its windows hold.
  void focus(int source) { focus_ = source; }
  int64_t whole_batches(int source) const { return mixture_->source(source).windows() / B_; }
  // The token that begins a document under data.document_mask (data.document_token, or the data's
  // tokenizer's end-of-document token; a SpecError when it has none); -1 without the mask.
  int document_token() const { return document_token_; }
  // Which windows were read since the last call: the sum, mod 2^48, of a hash of each one's place
  // (file and start), whatever rank read it and in what order; sums over ranks combine alike.
  double take_digest();
  // Start offset of global sample g (g = step*global_batch + k).
  size_t window_start(int64_t g);
  // T inputs and T targets (inputs shifted by one) of global sample g.
  void sample(int64_t g, int* inputs, int* targets);
  // The samples of micro-batch mb of dp rank dp_rank at `step`, [B/(D*M), T] each.
  void micro_batch(int64_t step, int dp_rank, int mb, int* inputs, int* targets);

 private:
  const std::vector<uint32_t>& epoch_permutation(int64_t epoch);
  // Global sample g of a mixture: the weights' pick, or under focus that source's sample g.
  MixturePattern::Pick pick(int64_t g) const;
  std::vector<uint8_t> tokens_;       // synthetic and text: the whole stream
  std::unique_ptr<TokenFile> file_;   // hdf5: read by window
  std::unique_ptr<Mixture> mixture_;  // data.sources
  std::vector<uint32_t> window_;      // hdf5: the T + 1 tokens of one sample
  uint64_t digest_ = 0;
  int document_token_ = -1;
  int focus_ = -1;
  int T_, B_, D_, M_;
  bool shuffle_;
  uint64_t seed_;
  int64_t perm_epoch_ = -1;
  std::vector<uint32_t> perm_;
};

}  // namespace pipetrain
