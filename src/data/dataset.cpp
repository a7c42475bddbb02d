#include "pipetrain/data/dataset.hpp"

#include "pipetrain/data/tokenizer.hpp"

#include "pipetrain/util/files.hpp"
#include "pipetrain/util/rng.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <utility>

namespace pipetrain {
namespace {

// data.document_token, or where it is -1 the token that the data says ends its documents (a token
// file's document_token, `recorded`), else its tokenizer's end-of-document token (`tokenizer_model`:
// its SentencePiece model, "" for bytes or ids of an unknown tokenizer).
int document_token_of(const RunSpec& spec, const std::string& tokenizer_model, int64_t recorded = -1) {
  if (!spec.data.document_mask) return -1;
  if (spec.data.document_token >= 0) return spec.data.document_token;
  if (recorded >= 0) return static_cast<int>(recorded);
  const std::string where = spec.origin("data.document_mask") + ": data.document_token: ";
  const int eos =
      tokenizer_model.empty() ? -1 : Tokenizer::sentencepiece(tokenizer_model, where).special_tokens().eos.id;
  if (eos < 0)
    throw SpecError(where + "the data's tokenizer (" +
                    (tokenizer_model.empty() ? "bytes, or ids of an unknown tokenizer" : "its SentencePiece model") +
                    ") has no end-of-document token: name the token that begins a document (GPT-2's <|endoftext|> "
                    "is 50256)");
  return eos;
}

using Rng = SplitMix64;

}  // namespace

std::vector<uint8_t> synthetic_corpus(uint64_t seed, size_t n_bytes, uint64_t stream) {
  Rng rng{seed ^ 0x5eed5eed5eedULL};
  const int n_words = 192, n_next = 4;
  std::vector<std::string> words(n_words);
  for (auto& w : words) {
    int len = 2 + rng.below(5);
    for (int i = 0; i < len; ++i) w += static_cast<char>('a' + rng.below(26));
  }
  // Each word is followed by one of 4 successors with probabilities 1/2, 1/4, 1/8, 1/8.
  std::vector<int> successors(n_words * n_next);
  for (int& s : successors) s = rng.below(n_words);
  if (stream) rng = Rng{rng.s ^ (stream * 0xd1b54a32d192ed03ULL)};  // same words, other sentences
  std::vector<uint8_t> out;
  out.reserve(n_bytes);
  int word = rng.below(n_words);
  while (out.size() < n_bytes) {
    out.insert(out.end(), words[word].begin(), words[word].end());
    if (rng.below(8) == 0) {
      out.push_back('.');
      out.push_back('\n');
      word = rng.below(16);  // sentences open with one of a few words
      continue;
    }
    out.push_back(' ');
    uint32_t r = rng.below(8);
    int pick = r < 4 ? 0 : r < 6 ? 1 : r < 7 ? 2 : 3;
    word = successors[word * n_next + pick];
  }
  out.resize(n_bytes);
  return out;
}

Dataset::Dataset(const RunSpec& spec, Split split)
    : T_(spec.model.seq_len),
      B_(spec.train.global_batch),
      D_(spec.parallel.dp),
      M_(spec.parallel.micro_batches),
      shuffle_(spec.data.shuffle && split == Split::train),
      seed_(static_cast<uint64_t>(spec.run.seed)) {
  const bool val = split == Split::val;
  switch (spec.data.source) {
    case DataSource::synthetic:
      tokens_ = val ? synthetic_corpus(seed_, kSyntheticValBytes, 1) : synthetic_corpus(seed_, kSyntheticBytes);
      break;
    case DataSource::hdf5: {
      window_.resize(static_cast<size_t>(T_) + 1);
      if (!spec.data.sources.empty()) {
        mixture_ = std::make_unique<Mixture>(spec, split);
        document_token_ =
            document_token_of(spec, mixture_->source(0).tokenizer_model(), mixture_->source(0).document_token());
        return;  // each source checked its own files
      }
      const std::string where = spec.origin("data.path") + ": data.path: ";
      try {
        file_ = std::make_unique<TokenFile>(spec.data.path, split);
      } catch (const SpecError& e) {
        throw SpecError(where + e.what());
      }
      if (file_->vocab_size() > spec.model.vocab)
        throw SpecError(where + spec.data.path + " has vocab_size " + std::to_string(file_->vocab_size()) +
                        " but model.vocab = " + std::to_string(spec.model.vocab) + " (set model.vocab to at least " +
                        std::to_string(file_->vocab_size()) + ")");
      if (spec.data.document_mask) {
        const TokenFileInfo info = read_token_file_info(spec.data.path);
        document_token_ = document_token_of(spec, info.tokenizer_model, info.document_token);
      }
      break;
    }
    case DataSource::text: {
      if (val) throw SpecError(spec.origin("eval.every_steps") + ": no validation data for text");
      const std::string bytes = read_input_file(spec.data.path, spec.origin("data.path") + ": data.path");
      tokens_.assign(bytes.begin(), bytes.end());
      break;
    }
  }
  if (spec.data.source != DataSource::hdf5) document_token_ = document_token_of(spec, "");
  if (val && n_tokens() < static_cast<size_t>(T_) + 2)
    throw SpecError(spec.origin("eval.every_steps") + ": eval.every_steps = " + std::to_string(spec.eval.every_steps) +
                    " but the validation tokens (" + std::to_string(n_tokens()) +
                    ") are fewer than model.seq_len + 2 = " + std::to_string(T_ + 2) +
                    (file_ ? " (a larger --val-fraction in pipetrain data prepare?)" : ""));
  if (n_tokens() < static_cast<size_t>(T_) + 2) {
    const bool synthetic = spec.data.source == DataSource::synthetic;
    throw SpecError(spec.origin(synthetic ? "model.seq_len" : "data.path") + ": " +
                    (synthetic ? "the synthetic corpus" : "data.path = \"" + spec.data.path + "\"") + " has " +
                    std::to_string(n_tokens()) + (file_ ? " train tokens" : " bytes") +
                    ", fewer than model.seq_len + 2 = " + std::to_string(T_ + 2));
  }
}

Dataset::~Dataset() = default;

std::string Dataset::repeats_within(int64_t samples) const {
  if (!mixture_) {
    const int64_t windows = (static_cast<int64_t>(n_tokens()) - T_ - 1) / T_;
    if (samples <= windows) return "";
    return "the " + std::to_string(n_tokens()) + " held-out tokens hold " + std::to_string(windows) + " windows";
  }
  std::vector<int64_t> taken(static_cast<size_t>(mixture_->sources()));
  for (int64_t g = 0; g < samples; ++g) ++taken[static_cast<size_t>(mixture_->pick(g).source)];
  for (int s = 0; s < mixture_->sources(); ++s)
    if (taken[s] > mixture_->source(s).windows())
      return "data.sources[" + std::to_string(s) + "]'s share is " + std::to_string(taken[s]) +
             " of them, but its held-out tokens hold " + std::to_string(mixture_->source(s).windows()) + " windows";
  return "";
}

const std::vector<uint32_t>& Dataset::epoch_permutation(int64_t epoch) {
  if (epoch == perm_epoch_) return perm_;
  const size_t E = std::max<size_t>(1, (n_tokens() - T_ - 1) / T_);
  perm_.resize(E);
  std::iota(perm_.begin(), perm_.end(), 0u);
  Rng rng{seed_ * 0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(epoch) + 1};
  for (size_t i = E; i > 1; --i) std::swap(perm_[i - 1], perm_[rng.next() % i]);  // Fisher-Yates
  perm_epoch_ = epoch;
  return perm_;
}

size_t Dataset::window_start(int64_t g) {
  const uint64_t span = n_tokens() - T_ - 1;
  if (!shuffle_) return static_cast<size_t>((static_cast<uint64_t>(g) * T_) % span);
  const uint64_t E = std::max<uint64_t>(1, span / T_);
  const auto& perm = epoch_permutation(static_cast<int64_t>(g / E));
  return static_cast<size_t>(perm[g % E]) * T_;
}

void Dataset::sample(int64_t g, int* inputs, int* targets) {
  auto copy = [&](const auto* w) {
    for (int t = 0; t < T_; ++t) {
      inputs[t] = static_cast<int>(w[t]);
      targets[t] = static_cast<int>(w[t + 1]);
    }
  };
  uint64_t place;
  if (mixture_) {
    const MixturePattern::Pick p = pick(g);
    place = mixture_->sample_from(p.source, p.index, window_.data());
    copy(window_.data());
  } else {
    const size_t start = window_start(g);
    if (file_) {
      file_->read(start, window_.size(), window_.data());  // checks every id against the file's vocab_size
      copy(window_.data());
    } else {
      copy(tokens_.data() + start);
    }
    place = SplitMix64{start}.next();
  }
  digest_ = (digest_ + (place & kDigestMask)) & kDigestMask;
}

double Dataset::take_digest() {
  return static_cast<double>(std::exchange(digest_, 0));  // < 2^48: exact in a double
}

void Dataset::micro_batch(int64_t step, int dp_rank, int mb, int* inputs, int* targets) {
  const int per_rank = B_ / D_, per_mb = per_rank / M_;
  auto first_of = [&](int64_t s, int m) {
    return s * B_ + static_cast<int64_t>(dp_rank) * per_rank + static_cast<int64_t>(m) * per_mb;
  };
  const int64_t first = first_of(step, mb);
  for (int i = 0; i < per_mb; ++i)
    sample(first + i, inputs + static_cast<size_t>(i) * T_, targets + static_cast<size_t>(i) * T_);
  // The next micro-batch's windows start coming in while this one computes (raw files: read_ahead).
  if (!mixture_) return;
  const int64_t next = mb + 1 < M_ ? first_of(step, mb + 1) : first_of(step + 1, 0);
  for (int i = 0; i < per_mb; ++i) {
    const MixturePattern::Pick p = pick(next + i);
    mixture_->prefetch_from(p.source, p.index);
  }
}

MixturePattern::Pick Dataset::pick(int64_t g) const {
  return focus_ >= 0 ? MixturePattern::Pick{focus_, g} : mixture_->pick(g);
}

}  // namespace pipetrain
