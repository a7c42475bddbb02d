#include "pipetrain/data/corpus_formats.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "pipetrain/data/token_file.hpp"
#include "pipetrain/util/atomic_output.hpp"
#include "pipetrain/util/binary_file.hpp"
#include "pipetrain/util/errors.hpp"

namespace pipetrain {
namespace {

constexpr char kMegatronMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
constexpr uint64_t kMegatronHeader = 9 + 8 + 1 + 8 + 8;
constexpr uint64_t kMegatronSequence = 65536;  // tokens per exported sequence
constexpr size_t kBlockTokens = 1 << 21;       // tokens streamed at a time

std::string str(uint64_t v) { return std::to_string(v); }

// Reads exactly n bytes at `offset` of an input; a short read means the file was truncated.
void read_exactly(const BinaryReader& in, uint64_t offset, size_t n, void* out) {
  if (!in.read_at(offset, out, n)) throw SpecError(in.path() + ": truncated or unreadable at byte " + str(offset));
}
template <class T>
T value_at(const BinaryReader& in, uint64_t offset) {
  T v;
  read_exactly(in, offset, sizeof v, &v);
  return v;
}

}  // namespace

LlmcShard read_llmc_shard(const std::string& path) {
  const BinaryReader in(path);
  if (in.size() < kLlmcHeader)
    throw SpecError(path + ": llm.c shard truncated: " + str(in.size()) + " bytes, shorter than its 1024-byte header");
  int32_t h[256];
  read_exactly(in, 0, sizeof h, h);
  int version, width;
  if (h[0] == kLlmcMagic16) {
    version = 1;
    width = 2;
  } else if (h[0] == kLlmcMagic32) {
    version = 7;
    width = 4;
  } else {
    throw SpecError(path + ": not an llm.c token shard: magic " + std::to_string(h[0]) + " (expected " +
                    std::to_string(kLlmcMagic16) + " or " + std::to_string(kLlmcMagic32) + ")");
  }
  if (h[1] != version)
    throw SpecError(path + ": llm.c shard version " + std::to_string(h[1]) + " with magic " + std::to_string(h[0]) +
                    " (expected version " + std::to_string(version) + ")");
  if (h[2] < 0) throw SpecError(path + ": llm.c shard with a negative token count " + std::to_string(h[2]));
  const uint64_t count = static_cast<uint64_t>(h[2]), expected = kLlmcHeader + count * width;
  if (in.size() != expected)
    throw SpecError(path + ": " + str(in.size()) + " bytes, but its header counts " + str(count) + " tokens of " +
                    std::to_string(width) + " bytes (1024 + " + str(count) + " x " + std::to_string(width) + " = " +
                    str(expected) + " bytes): " + (in.size() < expected ? "truncated" : "trailing bytes"));
  return {count, width};
}

namespace {

RawTokens llmc_segment(const std::string& path) {
  const LlmcShard shard = read_llmc_shard(path);
  return {path, kLlmcHeader, shard.count, shard.width, false};
}

RawTokens nanogpt_segment(const std::string& path, const std::string& dtype) {
  const int width = dtype == "uint8" ? 1 : dtype == "uint16" ? 2 : dtype == "uint32" ? 4 : 0;
  if (!width) throw SpecError("data import: --dtype " + dtype + " (uint8, uint16 or uint32)");
  const BinaryReader in(path);
  if (in.size() % width)
    throw SpecError(path + ": " + str(in.size()) + " bytes, not a whole number of " + dtype +
                    " tokens (truncated, or another --dtype?)");
  return {path, 0, in.size() / width, width, false};
}

}  // namespace

std::string megatron_prefix(std::string prefix) {
  for (const char* suffix : {".idx", ".bin"})
    if (prefix.size() > 4 && prefix.compare(prefix.size() - 4, 4, suffix) == 0) prefix.resize(prefix.size() - 4);
  return prefix;
}

namespace {

RawTokens megatron_segment(const std::string& given) {
  const std::string prefix = megatron_prefix(given);
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  const BinaryReader idx(idx_path), bin(bin_path);
  if (idx.size() < kMegatronHeader)
    throw SpecError(idx_path + ": Megatron index truncated: " + str(idx.size()) + " bytes, shorter than its " +
                    str(kMegatronHeader) + "-byte header");
  char magic[9];
  read_exactly(idx, 0, 9, magic);
  if (std::memcmp(magic, kMegatronMagic, 9) != 0)
    throw SpecError(idx_path + ": not a Megatron indexed dataset index (it does not start with MMIDIDX\\0\\0)");
  const uint64_t version = value_at<uint64_t>(idx, 9);
  if (version != 1) throw SpecError(idx_path + ": Megatron index version " + str(version) + " (expected 1)");
  const uint8_t code = value_at<uint8_t>(idx, 17);
  static const struct {
    int width;
    bool is_signed;
    const char* name;
  } kCodes[9] = {{0, false, "?"},       {1, false, "uint8"},   {1, true, "int8"},
                 {2, true, "int16"},    {4, true, "int32"},    {8, true, "int64"},
                 {0, false, "float64"}, {0, false, "float32"}, {2, false, "uint16"}};
  if (code < 1 || code > 8 || !kCodes[code].width)
    throw SpecError(idx_path + ": dtype code " + std::to_string(code) +
                    (code == 6 || code == 7 ? std::string(" (") + kCodes[code].name + "): floats are not token ids"
                                            : " is unknown (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16)"));
  const int width = kCodes[code].width;
  const uint64_t n = value_at<uint64_t>(idx, 18), d = value_at<uint64_t>(idx, 26);
  const uint64_t expected = kMegatronHeader + 12 * n + 8 * d;
  if (n > idx.size() || d > idx.size() || idx.size() != expected)
    throw SpecError(idx_path + ": " + str(idx.size()) + " bytes, but it counts " + str(n) + " sequences and " + str(d) +
                    " documents (" + str(expected) + " bytes expected: truncated or damaged)");
  // The sequences must lie back to back from byte 0 of the .bin: then the corpus is one run.
  uint64_t tokens = 0, next = 0;
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers;
  for (uint64_t first = 0; first < n; first += kBlockTokens) {
    const uint64_t k = std::min<uint64_t>(kBlockTokens, n - first);
    lengths.resize(k);
    pointers.resize(k);
    read_exactly(idx, kMegatronHeader + 4 * first, 4 * k, lengths.data());
    read_exactly(idx, kMegatronHeader + 4 * n + 8 * first, 8 * k, pointers.data());
    for (uint64_t i = 0; i < k; ++i) {
      if (lengths[i] < 0 || static_cast<uint64_t>(pointers[i]) != next)
        throw SpecError(idx_path + ": sequence " + str(first + i) + " has length " + std::to_string(lengths[i]) +
                        " at byte " + std::to_string(pointers[i]) + " of the .bin (expected byte " + str(next) +
                        ": sequences back to back)");
      next += static_cast<uint64_t>(lengths[i]) * width;
      tokens += static_cast<uint64_t>(lengths[i]);
    }
  }
  if (bin.size() != next)
    throw SpecError(bin_path + ": " + str(bin.size()) + " bytes, but " + idx_path + " gives " + str(tokens) + " " +
                    kCodes[code].name + " tokens (" + str(next) +
                    " bytes): " + (bin.size() < next ? "truncated" : "trailing bytes"));
  int64_t last = 0;
  for (uint64_t i = 0; i < d; ++i) {
    const int64_t doc = value_at<int64_t>(idx, kMegatronHeader + 12 * n + 8 * i);
    const bool ends_right = (i > 0 || doc == 0) && (i + 1 < d || static_cast<uint64_t>(doc) == n);
    if (doc < last || static_cast<uint64_t>(doc) > n || !ends_right)
      throw SpecError(idx_path + ": document index " + str(i) + " is " + std::to_string(doc) +
                      " (document indices rise from 0 to the sequence count " + str(n) + ")");
    last = doc;
  }
  if (d == 0)
    throw SpecError(idx_path + ": no document indices (they rise from 0 to the sequence count " + str(n) + ")");
  return {bin_path, 0, tokens, width, kCodes[code].is_signed};
}

RawTokens segment_of(const TokenImportOptions& opt, const std::string& path) {
  const RawTokens s = raw_tokens(opt.format, path, opt.dtype);
  if (s.count == 0) throw SpecError(path + ": holds no tokens");
  return s;
}

// The files an import reads (a Megatron prefix is two).
std::vector<std::string> input_files(const TokenImportOptions& opt) {
  std::vector<std::string> files;
  for (const auto* list : {&opt.inputs, &opt.val})
    for (const std::string& in : *list) {
      if (opt.format != CorpusFormat::megatron) {
        files.push_back(in);
      } else {
        files.push_back(megatron_prefix(in) + ".idx");
        files.push_back(megatron_prefix(in) + ".bin");
      }
    }
  return files;
}

}  // namespace

RawTokens raw_tokens(CorpusFormat format, const std::string& path, const std::string& dtype) {
  return format == CorpusFormat::llmc      ? llmc_segment(path)
         : format == CorpusFormat::nanogpt ? nanogpt_segment(path, dtype)
                                           : megatron_segment(path);
}

void widen_raw(const uint8_t* raw, size_t n, const RawTokens& r, uint64_t first, uint32_t* ids) {
  if (!r.is_signed && r.width <= 4) return widen_ids(raw, n, r.width, ids);
  for (size_t i = 0; i < n; ++i) {
    int64_t v = 0;
    const uint8_t* p = raw + i * r.width;
    if (r.width == 1) {
      v = static_cast<int8_t>(*p);
    } else if (r.width == 2) {
      int16_t x;
      std::memcpy(&x, p, 2);
      v = x;
    } else if (r.width == 4) {
      int32_t x;
      std::memcpy(&x, p, 4);
      v = x;
    } else {
      std::memcpy(&v, p, 8);
    }
    if (v < 0 || v > std::numeric_limits<uint32_t>::max())
      throw SpecError(r.path + ": token " + str(first + i) + " is " + std::to_string(v) + ", not a token id");
    ids[i] = static_cast<uint32_t>(v);
  }
}

bool is_llmc_shard(const std::string& path) {
  return file_starts_with(path, &kLlmcMagic16, 4) || file_starts_with(path, &kLlmcMagic32, 4);
}

namespace {

bool is_megatron_index(const std::string& path) { return file_starts_with(path, kMegatronMagic, 9); }

// Streams a run's ids into the writer.
void stream(const RawTokens& s, TokenFileWriter& out) {
  const BinaryReader in(s.path);
  std::vector<uint8_t> raw(kBlockTokens * s.width);
  std::vector<uint32_t> ids(kBlockTokens);
  for (uint64_t first = 0; first < s.count; first += kBlockTokens) {
    const size_t k = static_cast<size_t>(std::min<uint64_t>(kBlockTokens, s.count - first));
    read_exactly(in, s.offset + first * s.width, k * s.width, raw.data());
    widen_raw(raw.data(), k, s, first, ids.data());
    out.append(ids.data(), k, s.path, first);
  }
}

// An output written to a staging file next to it and renamed into place by commit().
struct StagedFile {
  AtomicOutput output;
  BinaryWriter writer;
  StagedFile(const std::string& path, const OutputRule& rule) : output(path, rule), writer(output.staging()) {}
  void commit() {
    writer.close();
    output.commit();
  }
};

// Calls body(ids, n) for every block of a token file's split.
template <class F>
void for_each_block(const TokenFile& in, F body) {
  std::vector<uint32_t> ids(kBlockTokens);
  for (size_t first = 0; first < in.size(); first += kBlockTokens) {
    const size_t n = std::min<size_t>(kBlockTokens, in.size() - first);
    in.read(first, n, ids.data());
    body(ids.data(), n);
  }
}

void write_narrowed(BinaryWriter& out, const uint32_t* ids, size_t n, int width, std::vector<uint8_t>& buf) {
  buf.resize(n * width);
  for (size_t i = 0; i < n; ++i) std::memcpy(buf.data() + i * width, &ids[i], width);  // little-endian low bytes
  out.write(buf.data(), buf.size());
}

}  // namespace

std::string import_tokens(const TokenImportOptions& opt) {
  const std::string what = "data import";
  if (opt.inputs.empty()) throw SpecError(what + ": no input file given");
  if (opt.output.empty()) throw SpecError(what + ": no --output given");
  check_output(opt.output, token_file_output(what, input_files(opt), opt.force));
  if (opt.vocab_size < 0 || opt.vocab_size > (int64_t{1} << 32))
    throw SpecError(what + ": --vocab-size " + std::to_string(opt.vocab_size) +
                    " is not in [1, 2^32] (ids are 32-bit)");
  if (opt.val.empty() && !(opt.val_fraction >= 0 && opt.val_fraction < 1))
    throw SpecError(what + ": --val-fraction " + std::to_string(opt.val_fraction) + " is not in [0, 1)");
  // Every input checked before a byte is written.
  std::vector<RawTokens> train, val;
  uint64_t n_train = 0, n_val = 0;
  int widest = 1;
  for (const auto& in : opt.inputs) {
    train.push_back(segment_of(opt, in));
    n_train += train.back().count;
  }
  for (const auto& in : opt.val) {
    val.push_back(segment_of(opt, in));
    n_val += val.back().count;
  }
  for (const auto* list : {&train, &val})
    for (const auto& s : *list) widest = std::max(widest, std::min(s.width, 4));
  if (val.empty()) {
    n_val = static_cast<uint64_t>(static_cast<double>(n_train) * opt.val_fraction);
    n_train -= n_val;
  }
  TokenFileWriter::Options w;
  w.output = opt.output;
  w.force = opt.force;
  w.compress = opt.compress;
  w.what = what;
  w.inputs = input_files(opt);
  w.vocab = opt.vocab_size;
  w.width = opt.vocab_size > 0 ? token_width_for(opt.vocab_size) : widest;
  w.tokenizer = TokenizerKind::none;
  w.document_token = opt.document_token;
  TokenFileWriter out(w, n_train, n_val);
  for (const auto& s : train) stream(s, out);
  for (const auto& s : val) stream(s, out);
  std::vector<std::string> files;
  for (const auto* list : {&train, &val})
    for (const auto& s : *list) files.push_back(s.path);
  nlohmann::json how = {{"format", name_of(opt.format)}, {"train_files", opt.inputs.size()}};
  if (val.empty()) how["val_fraction"] = opt.val_fraction;
  out.commit(sources_json(files, "pipetrain data import", how.dump()));
  return opt.output + ": " + str(n_train) + " train and " + str(n_val) + " validation tokens (" + name_of(opt.format) +
         ", vocab " + std::to_string(out.vocab()) + (opt.vocab_size > 0 ? "" : " = largest id + 1") + ", uint" +
         std::to_string(8 * w.width) + ") from " + std::to_string(files.size()) + " file(s)";
}

namespace {

// `in` as one llm.c shard at opt.output: its 256-int header, then the ids as uint16 or uint32.
std::string export_llmc_shard(const TokenFile& in, const TokenExportOptions& opt, const OutputRule& rule) {
  if (in.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    throw SpecError("data export: " + opt.input + " holds " + str(in.size()) +
                    " tokens; an llm.c shard holds at most 2^31 - 1");
  const int width = std::max(2, token_width_for(in.vocab_size()));  // llm.c shards are uint16 or uint32
  int32_t header[256] = {};
  header[0] = width == 2 ? kLlmcMagic16 : kLlmcMagic32;
  header[1] = width == 2 ? 1 : 7;
  header[2] = static_cast<int32_t>(in.size());
  StagedFile out(opt.output, rule);
  out.writer.write(header, sizeof header);
  std::vector<uint8_t> buf;
  for_each_block(in, [&](const uint32_t* ids, size_t n) { write_narrowed(out.writer, ids, n, width, buf); });
  out.commit();
  return opt.output + ": " + str(in.size()) + " tokens, llm.c shard (uint" + std::to_string(8 * width) + ")";
}

}  // namespace

std::string export_tokens(const TokenExportOptions& opt) {
  const std::string what = "data export";
  if (opt.format == CorpusFormat::nanogpt) throw SpecError(what + ": --format nanogpt is not one of llmc | megatron");
  if (opt.output.empty()) throw SpecError(what + ": no --output given");
  const std::vector<std::string> inputs = {opt.input};
  const std::string prefix = megatron_prefix(opt.output);  // --output mx, mx.idx or mx.bin: mx.idx + mx.bin
  const OutputRule llmc_rule{what, "--output", "an llm.c token shard", is_llmc_shard, inputs, opt.force};
  const OutputRule idx_rule{what, "--output", "a Megatron index", is_megatron_index, inputs, opt.force};
  // A .bin holds bare ids: it is a Megatron dataset's only beside that dataset's index.
  const OutputRule bin_rule{what,
                            "--output",
                            "a Megatron data file",
                            [&](const std::string&) { return is_megatron_index(prefix + ".idx"); },
                            inputs,
                            opt.force};
  if (opt.format == CorpusFormat::llmc) {
    check_output(opt.output, llmc_rule);
  } else {
    check_output(prefix + ".idx", idx_rule);
    check_output(prefix + ".bin", bin_rule);
  }
  const TokenFile in(opt.input, opt.val ? Split::val : Split::train);
  const int64_t vocab = in.vocab_size();
  if (in.size() == 0)  // neither format has a use for an empty corpus, and imports refuse one
    throw SpecError(what + ": " + opt.input + ": /" + (opt.val ? "val" : "train") + " holds no tokens");
  if (opt.format == CorpusFormat::llmc) return export_llmc_shard(in, opt, llmc_rule);
  std::vector<uint8_t> buf;
  if (vocab > std::numeric_limits<int32_t>::max())
    throw SpecError(what + ": vocab_size " + std::to_string(vocab) + " too large for Megatron");
  const int width = token_width_for(vocab);
  const uint8_t code = width == 1 ? 1 : width == 2 ? 8 : 4;                                   // uint8, uint16, int32
  const uint64_t n_seq = (in.size() + kMegatronSequence - 1) / kMegatronSequence, n_doc = 2;  // one document
  StagedFile idx(prefix + ".idx", idx_rule), bin(prefix + ".bin", bin_rule);
  for_each_block(in, [&](const uint32_t* ids, size_t n) { write_narrowed(bin.writer, ids, n, width, buf); });
  const uint64_t version = 1;
  BinaryWriter& w = idx.writer;
  w.write(kMegatronMagic, 9);
  w.write(&version, 8);
  w.write(&code, 1);
  w.write(&n_seq, 8);
  w.write(&n_doc, 8);
  std::vector<int32_t> lengths(n_seq);
  std::vector<int64_t> pointers(n_seq);
  for (uint64_t i = 0; i < n_seq; ++i) {
    lengths[i] = static_cast<int32_t>(std::min<uint64_t>(kMegatronSequence, in.size() - i * kMegatronSequence));
    pointers[i] = static_cast<int64_t>(i * kMegatronSequence * width);
  }
  const int64_t docs[2] = {0, static_cast<int64_t>(n_seq)};
  w.write(lengths.data(), 4 * n_seq);
  w.write(pointers.data(), 8 * n_seq);
  w.write(docs, sizeof docs);
  // The data first, then the index: a prefix whose index exists always has its data. When the
  // index cannot be published, the new data goes too, so no pair is ever half new.
  bin.commit();
  try {
    idx.commit();
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(prefix + ".bin", ignored);
    throw;
  }
  return prefix + ".idx and " + prefix + ".bin: " + str(in.size()) + " tokens, Megatron indexed dataset (" +
         (code == 1   ? "uint8"
          : code == 8 ? "uint16"
                      : "int32") +
         ", " + str(n_seq) + " sequences, one document)";
}

}  // namespace pipetrain
