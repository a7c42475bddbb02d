#include "pipetrain/util/binary_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "pipetrain/util/errors.hpp"
#include "pipetrain/util/files.hpp"

namespace pipetrain {

BinaryReader::BinaryReader(const std::string& path) : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
  struct stat st {};
  const bool opened = fd_ >= 0 && fstat(fd_, &st) == 0;
  const std::string why = !opened ? std::strerror(errno) : !S_ISREG(st.st_mode) ? "not a regular file" : "";
  if (!why.empty()) {
    if (fd_ >= 0) ::close(fd_);  // the destructor does not run for a throwing constructor
    throw SpecError(path + ": cannot read (" + why + ")");
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

void read_ahead(const std::string& path, uint64_t offset, uint64_t bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::posix_fadvise(fd, static_cast<off_t>(offset), static_cast<off_t>(bytes), POSIX_FADV_WILLNEED);
  ::close(fd);  // the readahead it started goes on
}

bool file_starts_with(const std::string& path, const void* head, size_t n) {
  std::vector<unsigned char> got(n);
  try {
    return BinaryReader(path).read_at(0, got.data(), n) && std::memcmp(got.data(), head, n) == 0;
  } catch (const SpecError&) {
    return false;
  }
}

BinaryReader::~BinaryReader() {
  if (fd_ >= 0) ::close(fd_);
}

bool BinaryReader::read_at(uint64_t offset, void* out, size_t n) const {
  auto* p = static_cast<char*>(out);
  while (n > 0) {
    const ssize_t got = ::pread(fd_, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return true;
}

BinaryWriter::BinaryWriter(const std::string& path) : path_(path), f_(std::fopen(path.c_str(), "wb")) {
  if (!f_) throw std::runtime_error(path + ": cannot create (" + std::strerror(errno) + ")");
}

BinaryWriter::~BinaryWriter() {
  if (f_) std::fclose(f_);
}

void BinaryWriter::write(const void* data, size_t bytes) {
  if (std::fwrite(data, 1, bytes, f_) != bytes)
    throw std::runtime_error(path_ + ": cannot write (" + std::strerror(errno) + "; " + free_space_note(path_) + ")");
}

void BinaryWriter::close() {
  const bool ok = std::fflush(f_) == 0 && ::fsync(fileno(f_)) == 0;
  const int err = errno;
  const bool closed = std::fclose(f_) == 0;
  f_ = nullptr;
  if (!ok || !closed) throw std::runtime_error(path_ + ": cannot write (" + std::strerror(err) + ")");
}

void copy_file_synced(const std::string& from, const std::string& to) {
  const std::string bytes = read_input_file(from, "copy");
  BinaryWriter out(to);
  out.write(bytes.data(), bytes.size());
  out.close();
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace pipetrain
