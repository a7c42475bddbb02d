#include "pipetrain/interop/atomic_output.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include "pipetrain/util/errors.hpp"
#include "pipetrain/util/files.hpp"

namespace fs = std::filesystem;

namespace pipetrain {

AtomicOutput::AtomicOutput(const std::string& path, bool replace) : path_(path) {
  std::error_code ec;
  if (fs::exists(fs::symlink_status(path, ec)) && !replace)
    throw SpecError(path + " already exists (pass --force to replace it)");
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec))
    throw SpecError(path + ": the folder " + parent.string() + " does not exist");
  staging_ = path + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(staging_, ec);  // a leftover of an earlier attempt by a process with this pid
}

AtomicOutput::~AtomicOutput() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(staging_, ec);
}

void AtomicOutput::commit() {
  sync_path(staging_);
  std::error_code ec;
  // A rename replaces a file but not a folder: an existing output is first moved aside, then
  // removed once the new one is in place.
  const std::string aside = path_ + ".old-" + std::to_string(::getpid());
  const bool had_old = fs::exists(fs::symlink_status(path_, ec));
  if (had_old) {
    fs::rename(path_, aside, ec);
    if (ec) throw std::runtime_error(path_ + ": cannot move the old output aside (" + ec.message() + ")");
  }
  fs::rename(staging_, path_, ec);
  if (ec) {
    std::error_code back;
    if (had_old) fs::rename(aside, path_, back);
    throw std::runtime_error(path_ + ": cannot rename " + staging_ + " into place (" + ec.message() + ")");
  }
  committed_ = true;
  const std::string parent = fs::path(path_).parent_path().string();
  sync_path(parent.empty() ? "." : parent);
  if (had_old) fs::remove_all(aside, ec);
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

}  // namespace pipetrain
