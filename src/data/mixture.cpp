#include "pipetrain/data/mixture.hpp"

#include "pipetrain/data/corpus_index.hpp"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <stdexcept>

#include "pipetrain/data/corpus_formats.hpp"
#include "pipetrain/data/index_permutation.hpp"
#include "pipetrain/util/rng.hpp"

namespace pipetrain {

MixturePattern::MixturePattern(const std::vector<double>& weights)
    : source_(kBlock), rank_(kBlock), per_block_(weights.size()) {
  double total = 0;
  for (double w : weights) total += w;
  for (int i = 0; i < kBlock; ++i) {
    int best = 0;
    double behind = -1e300;
    for (size_t s = 0; s < weights.size(); ++s) {
      const double b = weights[s] / total * (i + 1) - static_cast<double>(per_block_[s]);
      if (b > behind) {
        behind = b;
        best = static_cast<int>(s);
      }
    }
    source_[i] = static_cast<uint16_t>(best);
    rank_[i] = static_cast<uint32_t>(per_block_[best]++);
  }
  for (size_t s = 0; s < weights.size(); ++s)
    if (per_block_[s] == 0)
      throw std::invalid_argument("source " + std::to_string(s) + "'s weight is below one sample in " +
                                  std::to_string(kBlock));
}

MixturePattern::Pick MixturePattern::pick(int64_t g) const {
  const int64_t block = g / kBlock, i = g % kBlock;
  const int s = source_[i];
  return {s, block * per_block_[s] + rank_[i]};
}

int64_t MixturePattern::taken(int source, int64_t n) const {
  const int64_t rest = n % kBlock;
  return n / kBlock * per_block_[source] + std::count(source_.begin(), source_.begin() + rest, source);
}

std::vector<std::string> source_files(const std::string& path, const std::string& format, size_t* read_files) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  std::error_code ec;
  if (format == "megatron") {  // each dataset's .bin, found by its .idx
    std::vector<std::string> indexes;
    const bool many = path.find_first_of("*?[") != std::string::npos || fs::is_directory(path, ec);
    if (!many) {
      indexes.push_back(megatron_prefix(path) + ".idx");
    } else {
      for (const std::string& f : source_files(path, "nanogpt", nullptr))  // every file named
        if (f.size() > 4 && f.compare(f.size() - 4, 4, ".idx") == 0) indexes.push_back(f);
      if (indexes.empty()) throw SpecError(path + ": no Megatron index (.idx) among its files");
    }
    for (const std::string& idx : indexes) files.push_back(megatron_prefix(idx) + ".bin");
    return files;
  }
  if (path.find_first_of("*?[") != std::string::npos) {
    glob_t g{};
    if (glob(path.c_str(), 0, nullptr, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);  // sorted by glob
    globfree(&g);
    if (files.empty()) throw SpecError(path + ": no file matches");
  } else if (fs::is_directory(path, ec)) {
    std::vector<std::string> listed;  // its files but the index: the token files and shards among them
    for (const fs::directory_entry& e : fs::directory_iterator(path, ec))
      if (e.is_regular_file(ec) && e.path().filename().string().rfind(kIndexName, 0) != 0)
        listed.push_back(e.path().string());
    std::vector<char> member(listed.size(), 1);
    if (format == "auto") corpus_files(listed, format, read_files, &member);  // from the folder's index
    for (size_t i = 0; i < listed.size(); ++i)
      if (member[i]) files.push_back(listed[i]);
    std::sort(files.begin(), files.end());
    if (files.empty())
      throw SpecError(path + ": a folder without token files (pipetrain data prepare makes them) or llm.c shards");
  } else {
    files.push_back(path);  // TokenSource says what is wrong with it
  }
  return files;
}

TokenSource::TokenSource(const std::vector<std::string>& files, Split split, int T, bool shuffle, uint64_t key,
                         int64_t vocab, const std::string& what, const std::string& format)
    : files_(files),
      split_(split),
      T_(T),
      shuffle_(shuffle),
      key_(key),
      first_window_{0},
      vocab_limit_(vocab),
      what_(what) {
  // What each file holds, from the folders' indexes where they are current (corpus_index.hpp).
  std::vector<CorpusFile> facts;
  try {
    facts = corpus_files(files_, format, &files_read_);
  } catch (const SpecError& e) {
    throw SpecError(what + ": " + e.what());
  }
  for (size_t i = 0; i < files_.size(); ++i) {
    const CorpusFile& info = facts[i];
    layout_.push_back({files_[i], info.raw_offset, info.train, info.raw_width, info.raw_signed});
    if (i == 0) {
      tokenizer_ = info.tokenizer;
      document_token_ = info.document_token;
    } else if (info.tokenizer != tokenizer_ || info.model_hash != facts.front().model_hash) {
      throw SpecError(what + ": " + files_[i] + " was tokenized otherwise than " + files_.front() + " (" +
                      name_of(info.tokenizer) + " against " + name_of(tokenizer_) + ", or another model)");
    }
    // An llm.c shard is one split, whichever it serves; a token file has both.
    const size_t n = info.raw_width || split == Split::train ? info.train : info.val;
    // Windows of T + 1 tokens at a stride of T: starts 0, T, ..., while start + T + 1 <= n.
    const int64_t windows = n > static_cast<size_t>(T) ? static_cast<int64_t>((n - 1) / T) : 0;
    first_window_.push_back(first_window_.back() + windows);
    tokens_ += n;
    vocab_ = std::max(vocab_, info.vocab);
  }
  // The model itself (for the run directory and checkpoints), from the first file alone.
  if (!facts.empty() && facts.front().model_hash)
    tokenizer_model_ = read_token_file_info(files_.front()).tokenizer_model;
  if (windows() == 0)
    throw SpecError(what + ": no file holds model.seq_len + 1 = " + std::to_string(T + 1) +
                    (split == Split::train ? " training" : " validation") + " tokens");
}

TokenSource::Where TokenSource::where(int64_t j) const {
  const int64_t E = windows(), epoch = j / E, k = j % E;
  const int64_t w = shuffle_ ? static_cast<int64_t>(permute_index(static_cast<uint64_t>(k), static_cast<uint64_t>(E),
                                                                  key_ + static_cast<uint64_t>(epoch)))
                             : k;
  const size_t file =
      static_cast<size_t>(std::upper_bound(first_window_.begin(), first_window_.end(), w) - first_window_.begin()) - 1;
  return {file, static_cast<size_t>(w - first_window_[file]) * static_cast<size_t>(T_)};
}

TokenSource::Where TokenSource::read(int64_t j, uint32_t* window) {
  const Where at = where(j);
  const RawTokens& layout = layout_[at.file];
  const int width = layout.width;
  auto it = std::find_if(open_.begin(), open_.end(), [&](const Open& o) { return o.file == at.file; });
  if (it == open_.end()) {
    constexpr size_t kOpenFiles = 4;  // shards are read in turn: a few handles, not one per file
    if (open_.size() == kOpenFiles) open_.pop_back();
    Open o{at.file, nullptr, nullptr};
    if (width) o.raw = std::make_unique<BinaryReader>(files_[at.file]);
    else o.tokens = std::make_unique<TokenFile>(files_[at.file], split_);
    open_.push_front(std::move(o));
  } else if (it != open_.begin()) {
    open_.splice(open_.begin(), open_, it);
  }
  const size_t n = static_cast<size_t>(T_) + 1;
  if (!width) {
    open_.front().tokens->read(at.start, n, window);  // checks ids against its vocab_size
    return at;
  }
  raw_.resize(n * width);
  if (!open_.front().raw->read_at(layout.offset + at.start * width, raw_.data(), raw_.size()))
    throw SpecError(what_ + ": " + files_[at.file] + " was truncated after it was opened");
  try {
    widen_raw(raw_.data(), n, layout, at.start, window);
  } catch (const SpecError& e) {
    throw SpecError(what_ + ": " + e.what());
  }
  for (size_t i = 0; i < n; ++i)
    if (window[i] >= static_cast<uint64_t>(vocab_limit_))
      throw SpecError(what_ + ": " + files_[at.file] + ": token id " + std::to_string(window[i]) + " at offset " +
                      std::to_string(at.start + i) + " is not below model.vocab = " + std::to_string(vocab_limit_));
  return at;
}

void TokenSource::prefetch(int64_t j) const {
  const Where at = where(j);
  const RawTokens& layout = layout_[at.file];
  if (layout.width)
    read_ahead(files_[at.file], layout.offset + at.start * layout.width,
               (static_cast<uint64_t>(T_) + 1) * layout.width);
}

std::vector<std::pair<std::string, int64_t>> tokens_by_source(const RunSpec& spec, const MixturePattern& pattern,
                                                              int64_t samples) {
  std::vector<std::pair<std::string, int64_t>> out;
  for (size_t s = 0; s < spec.data.sources.size(); ++s)
    out.emplace_back(spec.data.sources[s].name, pattern.taken(static_cast<int>(s), samples) * spec.model.seq_len);
  return out;
}

Mixture::Mixture(const RunSpec& spec, Split split)
    : pattern_([&] {
        std::vector<double> weights;
        for (const RunSpec::Data::Source& s : spec.data.sources) weights.push_back(s.weight);
        try {
          return MixturePattern(weights);
        } catch (const std::invalid_argument& e) {
          throw SpecError(spec.origin("data.sources") + ": data.sources: " + e.what() + " (raise its weight)");
        }
      }()) {
  const bool shuffle = spec.data.shuffle && split == Split::train;
  for (size_t i = 0; i < spec.data.sources.size(); ++i) {
    const RunSpec::Data::Source& s = spec.data.sources[i];
    const std::string what = spec.origin("data.sources") + ": data.sources[" + std::to_string(i) + "] (" + s.name + ")";
    // Held out: the source's `val` files, else its token files' /val (an llm.c shard is one split).
    const bool own_val = split == Split::val && !s.val.empty();
    std::vector<std::string> files;
    try {
      size_t read = 0;
      files = source_files(own_val ? s.val : s.path, s.format, &read);
      listing_read_ += read;
    } catch (const SpecError& e) {
      throw SpecError(what + (own_val ? ": val: " : ": ") + e.what());
    }
    if (split == Split::val && !own_val &&
        (s.format != "auto" || std::any_of(files.begin(), files.end(), is_llmc_shard)))
      throw SpecError(what + ": " + (s.format == "auto" ? std::string("llm.c shards") : s.format + " files") +
                      " hold no held-out split: give the source val = \"...\" (its validation files)");
    // Each source its own order: the run's seed, the source's place and the epoch pick it.
    const uint64_t key = static_cast<uint64_t>(spec.run.seed) * 0x9e3779b97f4a7c15ULL + (uint64_t{i} << 40);
    sources_.push_back(std::make_unique<TokenSource>(files, split, spec.model.seq_len, shuffle, key, spec.model.vocab,
                                                     what, s.format));
    const TokenSource &first = *sources_.front(), &it = *sources_.back();
    if (it.tokenizer() != first.tokenizer() || it.tokenizer_model() != first.tokenizer_model())
      throw SpecError(what + ": tokenized otherwise than data.sources[0] (" + first.file(0) + "; " +
                      name_of(it.tokenizer()) + " against " + name_of(first.tokenizer()) + ", or another model)");
    if (it.vocab_size() > spec.model.vocab)
      throw SpecError(what + ": vocab_size " + std::to_string(it.vocab_size()) +
                      " but model.vocab = " + std::to_string(spec.model.vocab) + " (set model.vocab to at least " +
                      std::to_string(it.vocab_size()) + ")");
  }
}

size_t Mixture::files_read() const {
  size_t n = listing_read_;
  for (const auto& s : sources_) n += s->files_read();
  return n;
}

uint64_t Mixture::sample(int64_t g, uint32_t* window) {
  const MixturePattern::Pick p = pattern_.pick(g);
  return sample_from(p.source, p.index, window);
}

uint64_t Mixture::sample_from(int s, int64_t j, uint32_t* window) {
  const TokenSource::Where at = sources_[s]->read(j, window);
  return SplitMix64{(uint64_t(s) << 56) ^ (uint64_t(at.file) << 40) ^ at.start}.next();
}

}  // namespace pipetrain
