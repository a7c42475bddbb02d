// Pre-tokenized corpora of other tools, in and out of pipetrain's token files (streamed: never a
// whole corpus in memory). All little-endian.
//
// - llmc: llm.c shards: a header of 256 int32 (magic 20240520, version 1: uint16 tokens; or magic
//   20240801, version 7: uint32 tokens; [2] = the token count), then the tokens; the file's size
//   is exactly 1024 + count x width.
// - nanogpt: nanoGPT's train.bin / val.bin: headerless tokens, uint16 unless said otherwise.
// - megatron: a Megatron-LM indexed dataset PREFIX.idx + PREFIX.bin. The index: "MMIDIDX\0\0",
//   u64 version 1, u8 dtype code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64,
//   7 float32, 8 uint16), u64 sequence count n, u64 document count d, int32 sequence lengths [n],
//   int64 byte pointers [n], int64 document indices [d]. The sequences are read in order and
//   concatenated; they must lie back to back in the .bin and fill it exactly.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "pipetrain/config/choices.hpp"

namespace pipetrain {

// An llm.c shard, read in place by data.sources: `count` ids of `width` bytes after its header.
constexpr int32_t kLlmcMagic16 = 20240520, kLlmcMagic32 = 20240801;  // versions 1 and 7
constexpr uint64_t kLlmcHeader = 256 * sizeof(int32_t);
struct LlmcShard {
  uint64_t count = 0;
  int width = 2;
};
// Its header checked (magic, version, the file's size against the count): SpecError naming the file.
LlmcShard read_llmc_shard(const std::string& path);
bool is_llmc_shard(const std::string& path);  // the file starts with an llm.c magic

// PREFIX of a Megatron indexed dataset given as PREFIX, PREFIX.idx or PREFIX.bin.
std::string megatron_prefix(std::string prefix);

// A run of token ids stored raw in one file: `count` ids of `width` bytes from byte `offset`
// (signed ids, as Megatron may store them, must not be negative).
struct RawTokens {
  std::string path;
  uint64_t offset = 0, count = 0;
  int width = 2;
  bool is_signed = false;
};
// Where a file of `format` keeps its ids: an llm.c shard's after its header, a nanoGPT file's
// (`dtype`) from its start, a Megatron dataset's (`path`: its prefix, .idx or .bin) in its .bin, the
// index checked. SpecError naming the file and what was expected.
RawTokens raw_tokens(CorpusFormat format, const std::string& path, const std::string& dtype = "uint16");
// Ids [first, first + n) of `r` from their raw bytes; a negative or over-32-bit id is a SpecError
// naming the file and the id's place.
void widen_raw(const uint8_t* raw, size_t n, const RawTokens& r, uint64_t first, uint32_t* ids);

struct TokenImportOptions {
  CorpusFormat format = CorpusFormat::llmc;
  std::vector<std::string> inputs, val;  // val: separate held-out inputs (else --val-fraction)
  std::string output;
  int64_t vocab_size = 0;        // 0: the largest id + 1
  double val_fraction = 0.1;     // the last tokens of the inputs, when `val` is empty
  std::string dtype = "uint16";  // nanogpt: uint8 | uint16 | uint32
  int64_t document_token = -1;   // >= 0: the token between documents, recorded (token_file.hpp)
  bool compress = false, force = false;
};

// `pipetrain data import`: validates every input (header, version, dtype, size) before writing,
// then streams the tokens into a token file (tokenizer "none"). SpecError naming the file and what
// was expected. Returns a summary.
std::string import_tokens(const TokenImportOptions& opt);

struct TokenExportOptions {
  std::string input, output;                 // output: a file (llmc) / a PREFIX (megatron)
  CorpusFormat format = CorpusFormat::llmc;  // llmc or megatron
  bool val = false;                          // the /val tokens instead of /train
  bool force = false;
};

// `pipetrain data export`: one split of a token file as an llm.c shard (uint16 when the vocabulary
// fits, else uint32) or a Megatron indexed dataset (uint8, uint16 or int32 by the vocabulary; one
// document of sequences of at most 65536 tokens). Atomic. Returns a summary.
std::string export_tokens(const TokenExportOptions& opt);

}  // namespace pipetrain
