// Whole binary model files, read at offsets and written in sequence, with the shape arithmetic
// both directions share. Failures name the file: reading one is bad input (SpecError), writing one
// a fault (std::runtime_error: a full disk is not the user's input).
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace pipetrain {

// Asks the kernel to read bytes [offset, offset + bytes) of `path` into its page cache in the
// background (posix_fadvise WILLNEED), so that a read of them soon finds them there. Best effort:
// nothing happens where the file cannot be opened.
void read_ahead(const std::string& path, uint64_t offset, uint64_t bytes);

class BinaryReader {
 public:
  explicit BinaryReader(const std::string& path);  // SpecError "PATH: cannot read (reason)"
  ~BinaryReader();
  BinaryReader(const BinaryReader&) = delete;
  BinaryReader& operator=(const BinaryReader&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  // n bytes from `offset`; false when the file ends first.
  bool read_at(uint64_t offset, void* out, size_t n) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Whether `path` is a regular file whose first n bytes are `head` (telling file kinds apart; never
// throws).
bool file_starts_with(const std::string& path, const void* head, size_t n);

class BinaryWriter {
 public:
  explicit BinaryWriter(const std::string& path);
  ~BinaryWriter();
  BinaryWriter(const BinaryWriter&) = delete;
  BinaryWriter& operator=(const BinaryWriter&) = delete;

  void write(const void* data, size_t bytes);
  void close();  // flushes and fsyncs

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

// Copies a file into `to` (synced), for what an export carries along unchanged.
void copy_file_synced(const std::string& from, const std::string& to);

// Elements of a tensor of this shape, and the shape as "[768, 2304]" for messages.
inline int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}
std::string shape_text(const std::vector<int64_t>& shape);

}  // namespace pipetrain
