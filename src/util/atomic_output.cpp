#include "pipetrain/util/atomic_output.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <stdexcept>

#include "pipetrain/util/errors.hpp"
#include "pipetrain/util/files.hpp"

namespace fs = std::filesystem;

namespace pipetrain {
namespace {

bool exists_here(const std::string& path) {  // the name itself, a dangling symlink included
  std::error_code ec;
  return fs::exists(fs::symlink_status(path, ec));
}

bool same_inode(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

// The absolute, normalised path with symlinks of its existing part resolved, for comparing where
// two paths lead.
fs::path resolved(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  return ec ? fs::absolute(path).lexically_normal() : p;
}

// Whether `outer` is a folder above `inner` (both resolved).
bool holds(const fs::path& outer, const fs::path& inner) {
  auto o = outer.begin(), i = inner.begin();
  for (; o != outer.end() && !o->empty(); ++o, ++i)
    if (i == inner.end() || *o != *i) return false;
  return i != inner.end();
}

std::string what_is_at(const std::string& path) {
  std::error_code ec;
  const fs::file_status s = fs::status(path, ec);
  if (fs::is_symlink(fs::symlink_status(path, ec)) && !fs::exists(s)) return "a dangling symbolic link";
  if (fs::is_directory(s)) return "a folder";
  if (fs::is_regular_file(s)) return "a file";
  return "neither a file nor a folder";
}

}  // namespace

bool folder_holds_only(const std::string& dir, const std::function<bool(const std::string& name)>& allowed) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (!e.is_regular_file(ec) || !allowed(e.path().filename().string())) return false;
  return !ec;
}

std::string protected_folder_kind(const std::string& dir) {
  std::error_code ec;
  const fs::path d(dir);
  if (!fs::is_directory(d, ec)) return "";
  auto has = [&](const char* name) { return fs::exists(d / name, ec); };
  if (has("manifest.json")) return "a pipetrain checkpoint";
  if (has("latest") && d.filename() == "checkpoints") return "a run's checkpoints folder";
  if (has("config.toml") && (has("metrics.jsonl") || has("events.jsonl") || has("checkpoints") || has(".lock")))
    return "a pipetrain run directory";
  return "";
}

void check_output(const std::string& path, const OutputRule& rule) {
  const std::string named = rule.command + ": " + rule.option + " " + path;
  const fs::path out = resolved(path);
  for (const std::string& in : rule.inputs) {
    if (same_inode(path, in) || out == resolved(in))
      throw SpecError(named + " is the input " + in +
                      " of this command: writing it would destroy what is read "
                      "(choose another " +
                      rule.option + ")");
    if (holds(out, resolved(in)))
      throw SpecError(named + " holds the input " + in + ": replacing it would destroy what is read (choose another " +
                      rule.option + ")");
  }
  if (const std::string kind = protected_folder_kind(path); !kind.empty())
    throw SpecError(named + " is " + kind + ": pipetrain never writes over one (choose another " + rule.option + ")");
  for (fs::path above = out.parent_path(); !above.empty(); above = above.parent_path()) {
    const std::string kind = protected_folder_kind(above.string());
    if (kind == "a pipetrain checkpoint" || kind == "a run's checkpoints folder")
      throw SpecError(named + " lies inside " + above.string() + ", " + kind +
                      ": it holds only what training saved (choose another " + rule.option + ")");
    if (above == above.root_path()) break;
  }
  if (!exists_here(path)) return;
  if (!rule.force) throw SpecError(named + " already exists (pass --force to replace it)");
  if (!rule.is_own || !rule.is_own(path))
    throw SpecError(named + " is " + what_is_at(path) + ", not " + rule.kind + ": --force replaces only " + rule.kind +
                    " (choose another " + rule.option + ", or move " + path + " away yourself)");
}

AtomicOutput::AtomicOutput(const std::string& path, const OutputRule& rule) : path_(path) {
  while (path_.size() > 1 && path_.back() == '/') path_.pop_back();  // "out/" stages beside out, not inside
  check_output(path_, rule);
  std::error_code ec;
  const fs::path parent = fs::path(path_).parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec)) {
    fs::create_directories(parent, ec);
    if (!fs::is_directory(parent))
      throw SpecError(rule.command + ": " + rule.option + " " + path + ": cannot create the folder " + parent.string() +
                      (ec ? " (" + ec.message() + ")" : ""));
  }
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
  const bool had_old = exists_here(path_);
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
