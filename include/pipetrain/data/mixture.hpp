// A mixture of token sources (data.sources): global sample g goes to the source a fixed pattern
// that follows the weights deals it, and within that source to its next window, so the sample at
// each global index depends on the spec and g alone: any layout, any dp, any resume reads the
// same sample at the same index (docs/design.md, "Data order").
//
// The pattern deals blocks of kBlock samples alike: sample i of a block goes to the source
// furthest behind its share (the largest w_s (i + 1) - taken_s, ties to the first listed), so every
// prefix of a block is within one sample of each source's share. Sample g is then sample
// j = (g / kBlock) x (the source's samples per block) + (its rank among them in the block) of its
// source. A source is its files' windows of T + 1 tokens (stride T, none crossing a file's end;
// a token file's /train or /val by the split, an llm.c shard's tokens read in place, whole),
// file after file; its sample j is window j mod E of epoch j / E (E windows), shuffled per epoch
// by a seeded bijection (index_permutation.hpp), so nothing the size of the corpus is held. A
// source smaller than its share simply goes round more often.
#pragma once
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "pipetrain/config/spec.hpp"
#include "pipetrain/data/corpus_formats.hpp"
#include "pipetrain/data/token_file.hpp"
#include "pipetrain/util/binary_file.hpp"

namespace pipetrain {

class MixturePattern {
 public:
  static constexpr int kBlock = 1 << 16;
  // Weights > 0, relative to each other; a weight below one sample per block is refused
  // (std::invalid_argument naming its index).
  explicit MixturePattern(const std::vector<double>& weights);
  struct Pick {
    int source;
    int64_t index;  // the source's index-th sample
  };
  Pick pick(int64_t g) const;
  int64_t per_block(int source) const { return per_block_[source]; }
  int64_t taken(int source, int64_t n) const;  // of global samples [0, n), how many it deals `source`

 private:
  std::vector<uint16_t> source_;  // per sample of a block
  std::vector<uint32_t> rank_;    // its rank among its source's samples of the block
  std::vector<int64_t> per_block_;
};

// The training tokens drawn from each of spec.data.sources (by name) in the first `samples`
// global samples.
std::vector<std::pair<std::string, int64_t>> tokens_by_source(const RunSpec& spec, const MixturePattern& pattern,
                                                              int64_t samples);

// The files a source's path names, sorted: the file itself; a glob's matches; a folder's token
// files and llm.c shards (known from its index, corpus_index.hpp; `read_files` counts the files
// opened to tell), or with format "nanogpt" all its files. With format "megatron" each indexed
// dataset's .bin: the path names a prefix (or its .idx or .bin), a glob or folder the .idx files.
// SpecError ("<path>: ...") when it names none.
std::vector<std::string> source_files(const std::string& path, const std::string& format = "auto",
                                      size_t* read_files = nullptr);

// One source's token files, for one split, read window by window (a few files open at a time).
class TokenSource {
 public:
  // `what` names the source in errors ("data.sources[1] (code)"). SpecError when a file is not of
  // `format` (corpus_files), or no file has a whole window. Raw files' ids (llm.c, nanoGPT,
  // Megatron), which nothing bounds, are checked against `vocab` as they are read.
  TokenSource(const std::vector<std::string>& files, Split split, int T, bool shuffle, uint64_t key, int64_t vocab,
              const std::string& what, const std::string& format = "auto");
  int64_t windows() const { return first_window_.back(); }
  uint64_t tokens() const { return tokens_; }        // of its split, in all its files
  size_t files_read() const { return files_read_; }  // opened to learn what they hold (the rest: indexed)
  int64_t vocab_size() const { return vocab_; }      // the largest its token files record (0: llm.c shards only)
  size_t files() const { return files_.size(); }
  const std::string& file(size_t i) const { return files_[i]; }
  // What its files were tokenized with (all alike, or the constructor refused them).
  TokenizerKind tokenizer() const { return tokenizer_; }
  const std::string& tokenizer_model() const { return tokenizer_model_; }
  int64_t document_token() const { return document_token_; }  // its first file's (-1: none recorded)
  struct Where {
    size_t file;
    size_t start;  // its first token in the file
  };
  Where where(int64_t j) const;             // of the source's sample j
  Where read(int64_t j, uint32_t* window);  // its T + 1 tokens; returns where they lie
  // Starts reading sample j's bytes in the background (read_ahead) where its file keeps raw ids;
  // a token file's are read by HDF5 when asked (HDF5 here is not made for a second thread).
  void prefetch(int64_t j) const;

 private:
  std::vector<std::string> files_;
  Split split_;
  int T_;
  bool shuffle_;
  uint64_t key_;
  std::vector<int64_t> first_window_;  // per file, and the total at the end
  std::vector<RawTokens> layout_;      // per file: where a raw file keeps its ids (width 0: a token file)
  int64_t vocab_ = 0, vocab_limit_;
  std::string what_;
  std::vector<uint8_t> raw_;  // a raw window's bytes
  TokenizerKind tokenizer_ = TokenizerKind::none;
  std::string tokenizer_model_;
  int64_t document_token_ = -1;
  uint64_t tokens_ = 0;
  size_t files_read_ = 0;
  struct Open {
    size_t file;
    std::unique_ptr<TokenFile> tokens;  // a token file's, or
    std::unique_ptr<BinaryReader> raw;  // a raw file's
  };
  std::list<Open> open_;  // the most recently read first
};

// The sources of spec.data.sources for `split` (the validation split reads each source's /val, in
// order), with the pattern of their weights. Every file must be tokenized alike: ids mean nothing
// across tokenizers.
class Mixture {
 public:
  explicit Mixture(const RunSpec& spec, Split split);  // SpecError naming data.sources[i]
  MixturePattern::Pick pick(int64_t g) const { return pattern_.pick(g); }
  const MixturePattern& pattern() const { return pattern_; }
  // The T + 1 tokens of global sample g; returns where they lie (source, file, start), hashed.
  uint64_t sample(int64_t g, uint32_t* window);
  // The same for sample j of source s alone (its own validation reads them in order).
  uint64_t sample_from(int s, int64_t j, uint32_t* window);
  // Read-ahead (TokenSource::prefetch) of source s's sample j.
  void prefetch_from(int s, int64_t j) const { sources_[s]->prefetch(j); }
  int sources() const { return static_cast<int>(sources_.size()); }
  const TokenSource& source(int s) const { return *sources_[s]; }
  // Files opened to learn what they hold while opening it (listing folders, then the sources').
  size_t files_read() const;

 private:
  MixturePattern pattern_;
  std::vector<std::unique_ptr<TokenSource>> sources_;
  size_t listing_read_ = 0;
};

}  // namespace pipetrain
