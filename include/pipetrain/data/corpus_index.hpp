// What the files of a corpus hold, known without opening them: each folder holding some keeps an
// index of the files examined there (kIndexName), so a source of a thousand shards opens in the
// time it takes to stat them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "pipetrain/config/choices.hpp"

namespace pipetrain {

constexpr const char* kIndexName = ".pipetrain_index.json";

// A corpus file's facts, as a TokenSource needs them: a token file's, or where a file of raw ids
// (an llm.c shard, a nanoGPT file, a Megatron dataset's .bin) keeps them.
struct CorpusFile {
  int raw_width = 0;  // bytes per raw id; 0: a token file
  uint64_t raw_offset = 0;
  bool raw_signed = false;
  uint64_t train = 0, val = 0;  // token counts (a raw file's in train: it is one split, either)
  int64_t vocab = 0;            // a token file's vocab_size (0: an llm.c shard records none)
  TokenizerKind tokenizer = TokenizerKind::none;
  uint64_t model_hash = 0;  // of its SentencePiece model's bytes (0: none)
  int64_t document_token = -1;
};

// The facts of each file, in order, read as `format` says (a source's: "auto", token files and
// llm.c shards told apart by content; "nanogpt"; "megatron", the .bin files of indexed datasets). A
// file whose index entry has its size and modification time is not opened; the others are read
// (SpecError naming a file that is none of them) and their folders' indexes rewritten, atomically,
// by a name of their own (a folder where that fails is simply not cached). `read_files`, when
// given, counts the files opened. With `member` (a folder's listing), a file that is none is marked
// 0 there instead of refused.
std::vector<CorpusFile> corpus_files(const std::vector<std::string>& files, const std::string& format = "auto",
                                     size_t* read_files = nullptr, std::vector<char>* member = nullptr);

// The hash corpus_files records of a SentencePiece model's bytes.
uint64_t model_hash(const std::string& model_bytes);

}  // namespace pipetrain
