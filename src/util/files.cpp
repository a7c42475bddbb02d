#include "pipetrain/util/files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <stdexcept>

#include "pipetrain/util/errors.hpp"

namespace fs = std::filesystem;

namespace pipetrain {

std::string read_input_file(const std::string& path, const std::string& what, size_t max_bytes) {
  auto fail = [&](const std::string& why) { return SpecError(what + ": cannot read " + path + " (" + why + ")"); };
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) throw fail(std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw fail("not a regular file");
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    throw fail(std::to_string(st.st_size) + " bytes, more than the " + std::to_string(max_bytes) +
               " such a file can be: is it the right file?");
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw fail(std::strerror(errno));
  std::string data(static_cast<size_t>(st.st_size), '\0');
  size_t got = std::fread(data.data(), 1, data.size(), f);
  bool bad = std::ferror(f) != 0;
  std::fclose(f);
  if (bad || got != data.size()) throw fail("read error");
  return data;
}

RunDirLock::RunDirLock(const std::string& dir) : dir_(dir) {
  std::error_code ec;
  created_ = !fs::exists(dir, ec);
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir))  // say why (a read-only file system, a permission), not what follows from it
    throw SpecError("run dir " + dir + ": cannot create (" + (ec ? ec.message() : std::string("a file is in the way")) +
                    ")");
  const std::string path = dir + "/.lock";
  fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw SpecError("run dir " + dir + ": cannot create " + path + " (" + std::strerror(errno) + ")");
  struct flock whole {};
  whole.l_type = F_WRLCK;
  whole.l_whence = SEEK_SET;
  if (fcntl(fd_, F_SETLK, &whole) != 0) {
    const int err = errno;
    if (err == EACCES || err == EAGAIN) {
      char holder[512] = {0};
      const ssize_t n = pread(fd_, holder, sizeof holder - 1, 0);
      std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "another process";
      while (!who.empty() && who.back() == '\n') who.pop_back();
      close(fd_);
      fd_ = -1;
      throw SpecError("run dir " + dir + " is in use by " + who + " (" + path +
                      "); wait for that run to end, or start this one elsewhere with a new run.name or --run-dir");
    }
    std::fprintf(stderr, "pipetrain: warning: %s: cannot lock (%s); not guarding the run dir against a second run\n",
                 path.c_str(), std::strerror(err));
    return;
  }
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char since[32];
  std::strftime(since, sizeof since, "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  const std::string who = "pipetrain pid " + std::to_string(getpid()) + " on " + host + " since " + since + "\n";
  if (ftruncate(fd_, 0) != 0 || pwrite(fd_, who.data(), who.size(), 0) != static_cast<ssize_t>(who.size()))
    std::fprintf(stderr, "pipetrain: warning: %s: cannot record the owner (%s)\n", path.c_str(), std::strerror(errno));
}

RunDirLock::~RunDirLock() {
  if (fd_ < 0) return;
  // The owner line goes with the lock: a file naming a pid that ended looks like a stale lock.
  // The file itself stays in a run directory (removing it would race a run waiting to open it),
  // except with the directory this lock made and nothing else wrote to.
  [[maybe_unused]] const int emptied = ftruncate(fd_, 0);  // best effort: the lock is what matters
  // A run refused at start-up leaves no trace: a directory this lock made that holds nothing else
  // goes (a run dir that was written to, or held anything before, stays).
  std::error_code ec;
  bool only_lock = created_;
  for (const auto& e : fs::directory_iterator(dir_, ec)) only_lock = only_lock && e.path().filename() == ".lock";
  if (only_lock) fs::remove(dir_ + "/.lock", ec);
  close(fd_);  // drops the lock
  if (only_lock) fs::remove(dir_, ec);
}

std::string free_space_note(const std::string& path) {
  struct statvfs st {};
  if (statvfs(path.c_str(), &st) != 0) return "free space unknown";
  return human_bytes(static_cast<double>(st.f_bavail) * st.f_frsize) + " free of " +
         human_bytes(static_cast<double>(st.f_blocks) * st.f_frsize);
}

std::string human_bytes(double b) {
  char buf[32];
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", b, unit[u]);  // whole bytes below a KiB
  return buf;
}

void sync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error(path + ": cannot open to sync");
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw std::runtime_error(path + ": fsync failed");
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw std::runtime_error(tmp + ": cannot write (" + std::strerror(errno) + ")");
  const bool ok =
      std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  std::fclose(f);
  if (!ok) throw std::runtime_error(tmp + ": cannot write");
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw std::runtime_error(path + ": cannot replace (" + ec.message() + ")");
  const std::string parent = fs::path(path).parent_path().string();
  sync_path(parent.empty() ? "." : parent);
}

}  // namespace pipetrain
