#include "pipetrain/util/atomic_output.hpp"

#include <unistd.h>

#include <filesystem>
#include <stdexcept>

#include "pipetrain/util/errors.hpp"
#include "pipetrain/util/files.hpp"

namespace fs = std::filesystem;

namespace pipetrain {

AtomicOutput::AtomicOutput(const std::string& path, bool replace) : path_(path) {
  while (path_.size() > 1 && path_.back() == '/') path_.pop_back();  // "out/" stages beside out, not inside
  std::error_code ec;
  if (fs::exists(fs::symlink_status(path, ec)) && !replace)
    throw SpecError(path + " already exists (pass --force to replace it)");
  const fs::path parent = fs::path(path_).parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec) && (fs::create_directories(parent, ec), !fs::is_directory(parent)))
    throw SpecError(path + ": cannot create the folder " + parent.string() + (ec ? " (" + ec.message() + ")" : ""));
  staging_ = path_ + ".tmp-" + std::to_string(::getpid());
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

}  // namespace pipetrain
