// HDF5 token datasets (`pipetrain data prepare`): /train and /val, one byte token per element
// (uint8, chunked, optionally gzip-compressed), with root attributes format_version, vocab_size,
// tokenizer ("bytes") and sources (JSON: the input files, their sizes, when and how it was made).
// Training reads windows of /train by hyperslab, so no rank holds the corpus in memory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace pipetrain {

constexpr int kTokenFileFormat = 1;

struct PrepareOptions {
  std::vector<std::string> inputs;
  std::string output;
  double val_fraction = 0.1;  // the last tokens of the concatenated inputs
  bool compress = false;      // gzip level 4
  bool force = false;         // replace an existing output
};

// Writes the token file atomically (a temporary next to it, renamed into place). Bad input
// (unreadable or empty files, an existing output without force, a fraction outside [0, 1)) is a
// SpecError naming it; prints a progress line to stderr for inputs over 64 MiB. Returns a summary.
std::string prepare_token_file(const PrepareOptions& opt);

// One dataset of a token file, read by hyperslab.
class TokenFile {
 public:
  // SpecError naming the file and dataset if either is missing or malformed.
  TokenFile(const std::string& path, const std::string& dataset);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  size_t size() const { return size_; }
  int vocab_size() const { return vocab_; }
  void read(size_t start, size_t n, uint8_t* out) const;  // tokens [start, start + n)

 private:
  std::string path_, dataset_;
  int64_t file_ = -1, data_ = -1;  // hid_t
  size_t size_ = 0;
  int vocab_ = 0;
};

}  // namespace pipetrain
