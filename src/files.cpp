#include "pipetrain/files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "pipetrain/config.hpp"

namespace fs = std::filesystem;

namespace pipetrain {

std::string read_input_file(const std::string& path, const std::string& what) {
  auto fail = [&](const std::string& why) { return SpecError(what + ": cannot read " + path + " (" + why + ")"); };
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) throw fail(std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw fail("not a regular file");
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw fail(std::strerror(errno));
  std::string data(static_cast<size_t>(st.st_size), '\0');
  size_t got = std::fread(data.data(), 1, data.size(), f);
  bool bad = std::ferror(f) != 0;
  std::fclose(f);
  if (bad || got != data.size()) throw fail("read error");
  return data;
}

std::string free_space_note(const std::string& path) {
  struct statvfs st {};
  if (statvfs(path.c_str(), &st) != 0) return "free space unknown";
  auto human = [](double b) {
    char buf[32];
    const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) b /= 1024, ++u;
    std::snprintf(buf, sizeof buf, "%.1f %s", b, unit[u]);
    return std::string(buf);
  };
  return human(static_cast<double>(st.f_bavail) * st.f_frsize) + " free of " +
         human(static_cast<double>(st.f_blocks) * st.f_frsize);
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
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0 &&
                  ::fsync(fileno(f)) == 0;
  std::fclose(f);
  if (!ok) throw std::runtime_error(tmp + ": cannot write");
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw std::runtime_error(path + ": cannot replace (" + ec.message() + ")");
  const std::string parent = fs::path(path).parent_path().string();
  sync_path(parent.empty() ? "." : parent);
}

}  // namespace pipetrain
