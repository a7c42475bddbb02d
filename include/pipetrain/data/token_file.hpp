// HDF5 token files: /train and /val, 1-D arrays of token ids stored as uint8, uint16 or uint32 (the
// narrowest that holds the vocabulary), chunked and optionally gzip-compressed; root attributes
// format_version, vocab_size, tokenizer ("bytes", "sentencepiece", or "none" for imported ids
// whose tokenizer pipetrain does not know) and sources (JSON: what the
// tokens were made from, when and how); with a SentencePiece tokenizer, its model's bytes in
// /tokenizer_model. Where documents are separated, the attribute document_token (the token that
// ends each document) and /train_documents, /val_documents: each document's first offset. Training reads windows of
// /train by hyperslab, so no rank holds the corpus.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "pipetrain/config/choices.hpp"

#include "pipetrain/util/atomic_output.hpp"

namespace pipetrain {

// Format 2 added wide tokens and the tokenizer model; format-1 files (bytes only) still read.
constexpr int kTokenFileFormat = 2;

// Which tokens: the training stream, or the held-out validation tokens.
enum class Split { train, val };

// Bytes per stored token: 1, 2 or 4, the narrowest holding ids [0, vocab) (vocab <= 2^32).
int token_width_for(int64_t vocab);
// "uint8", "uint16" or "uint32" for a width of 1, 2 or 4 bytes.
const char* token_dtype_name(int width);

// One dataset of a token file, read by hyperslab into 32-bit ids whatever the stored width.
class TokenFile {
 public:
  // SpecError naming the file and dataset if either is missing or malformed.
  TokenFile(const std::string& path, Split split);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  size_t size() const { return size_; }
  int64_t vocab_size() const { return vocab_; }
  // Tokens [start, start + n). An id >= vocab_size is a SpecError naming the file and its offset.
  void read(size_t start, size_t n, uint32_t* out) const;

 private:
  std::string path_, dataset_;
  int64_t file_ = -1, data_ = -1;  // hid_t
  size_t size_ = 0;
  int64_t vocab_ = 0;
  int width_ = 1;
};

// What a token file says about itself (no tokens read): for `data inspect`, the run directory and
// checkpoints (which carry the tokenizer), and generate.
struct TokenFileInfo {
  int format = 0;
  int64_t vocab_size = 0;
  TokenizerKind tokenizer = TokenizerKind::none;  // none: imported ids, their tokenizer unknown
  std::string tokenizer_model;                    // the SentencePiece model's bytes ("" for bytes)
  std::string sources;                            // JSON
  size_t train = 0, val = 0;                      // token counts
  int width = 1;                                  // bytes per token
  bool compressed = false;
  int64_t document_token = -1;                    // -1: documents not separated
  size_t train_documents = 0, val_documents = 0;  // where they are
};
TokenFileInfo read_token_file_info(const std::string& path);  // SpecError naming the file

// Writes a token file of known size: `train` tokens, then `val` tokens, appended in order. The
// file is built next to the output and renamed into place by commit(), so a failed or abandoned
// write leaves no file (and an existing output untouched until commit). vocab = 0: not known up
// front; ids are then only limited by `width`, and vocab_size is recorded as the largest id + 1.
class TokenFileWriter {
 public:
  struct Options {
    std::string output;
    bool force = false;     // replace an existing output
    bool compress = false;  // gzip level 4
    int64_t vocab = 0;
    int width = 1;  // bytes per token (token_width_for(vocab) when the vocabulary is known)
    TokenizerKind tokenizer = TokenizerKind::bytes;
    std::string tokenizer_model;
    std::string what;                 // the command, for messages: "data prepare"
    std::vector<std::string> inputs;  // what the command reads: never the output (token_file_output)
    int64_t document_token = -1;      // >= 0: the tokens end documents with it; their starts are recorded
  };
  TokenFileWriter(Options opt, uint64_t train, uint64_t val);
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  // Appends ids; one >= the vocabulary (or too wide) is a SpecError naming `source` and the id's
  // offset there (source_offset: where `ids` starts in it). A failed write (a full disk) is a
  // fault: std::runtime_error naming the output.
  void append(const uint32_t* ids, size_t n, const std::string& source, uint64_t source_offset);
  // Checks every promised token came, records vocab_size and `sources`, flushes, fsyncs, renames
  // (std::runtime_error naming the output when the disk refuses).
  void commit(const std::string& sources_json);
  int64_t vocab() const;
  uint64_t documents() const { return documents_[0].size() + documents_[1].size(); }  // (after commit)

 private:
  void close_all();  // the HDF5 handles still open
  void write(int64_t dataset, uint64_t start, uint64_t n, const void* data);
  Options opt_;
  AtomicOutput output_;
  uint64_t train_, val_, done_ = 0;
  uint32_t max_id_ = 0;
  int64_t file_ = -1, train_ds_ = -1, val_ds_ = -1;
  std::vector<uint8_t> narrow8_;  // ids converted to the stored width (1 or 2 bytes; 4 are the ids)
  std::vector<uint16_t> narrow16_;
  std::vector<uint64_t> documents_[2];  // train's and val's document starts
};

// Whether `path` is a token file pipetrain reads (an HDF5 file with its attributes and /train).
bool is_token_file(const std::string& path);

// The output rule (check_output) of `command` writing a token file from `inputs`: --force replaces
// only a token file.
OutputRule token_file_output(const std::string& command, const std::vector<std::string>& inputs, bool force);

// The total size of input files, each checked to be a readable, non-empty regular file first
// (SpecError "<what> <path>: <why>").
uint64_t input_bytes(const std::vector<std::string>& inputs, const std::string& what);

// The "sources" JSON every writer records: inputs [{path, bytes}], created, by, plus `extra`.
std::string sources_json(const std::vector<std::string>& inputs, const std::string& by, const std::string& extra_json);

// Ids of one width (1, 2 or 4 bytes, little-endian in a file) widened to 32 bits.
void widen_ids(const uint8_t* raw, size_t n, int width, uint32_t* out);

}  // namespace pipetrain
