// A fresh directory under the system temp dir for one test, removed on destruction.
#pragma once
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

struct TempDir {
  std::filesystem::path dir;
  TempDir() {
    static std::atomic<int> counter{0};
    std::random_device rd;
    dir = std::filesystem::temp_directory_path() / ("pipetrain_test_" + std::to_string(::getpid()) + "_" +
                                                    std::to_string(counter++) + "_" + std::to_string(rd()));
    std::filesystem::create_directories(dir);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  // Writes `text` to <dir>/<name> and returns the path.
  std::string write(const std::string& name, const std::string& text) const {
    std::filesystem::path p = dir / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
};
