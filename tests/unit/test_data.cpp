// Token streams and the deterministic sample order (docs/design.md, "Data order"): window starts, samples,
// micro-batch slicing over dp ranks, seeded per-epoch shuffling, the synthetic corpus, bad files.
#include <catch2/catch.hpp>

#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "pipetrain/data/dataset.hpp"
#include "temp_dir.hpp"

using namespace pipetrain;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// Random bytes (including values >= 128, to catch sign-extension) written to <dir>/corpus.bin.
std::vector<uint8_t> write_corpus(const TempDir& tmp, size_t n, std::string* path) {
  std::mt19937 gen(42);
  std::vector<uint8_t> bytes(n);
  for (auto& b : bytes) b = static_cast<uint8_t>(gen() & 0xff);
  *path = (tmp.dir / "corpus.bin").string();
  std::ofstream(*path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), n);
  return bytes;
}

// T = 8, B = 12, D = 2, M = 3: 6 samples per dp rank, 2 per micro-batch.
RunSpec text_spec(const std::string& path, bool shuffle, int64_t seed = 1234) {
  return load_spec(
      "",
      {"data.source=text", "data.path=" + path, std::string("data.shuffle=") + (shuffle ? "true" : "false"),
       "model.seq_len=8", "train.global_batch=12", "parallel.dp=2", "parallel.micro_batches=3",
       "run.seed=" + std::to_string(seed)},
      0);
}

std::vector<size_t> epoch_windows(Dataset& ds, int64_t epoch, int64_t E) {
  std::vector<size_t> starts;
  for (int64_t i = 0; i < E; ++i) starts.push_back(ds.window_start(epoch * E + i));
  return starts;
}

std::string spec_error(const RunSpec& spec) {
  try {
    Dataset ds(spec);
  } catch (const SpecError& e) {
    return e.what();
  }
  return "<no SpecError>";
}

}  // namespace

TEST_CASE("unshuffled windows start at g*T mod (N-T-1) and targets are inputs shifted by one", "[data]") {
  TempDir tmp;
  std::string path;
  const size_t N = 1000;
  const int T = 8;
  auto bytes = write_corpus(tmp, N, &path);
  Dataset ds(text_spec(path, false));
  REQUIRE(ds.n_tokens() == N);
  std::vector<int> in(T), tg(T);
  for (int64_t g = 0; g < 3000; g += 7) {
    INFO("g=" << g);
    const size_t start = static_cast<size_t>((g * T) % static_cast<int64_t>(N - T - 1));
    REQUIRE(ds.window_start(g) == start);
    ds.sample(g, in.data(), tg.data());
    for (int t = 0; t < T; ++t) {
      CHECK(in[t] == bytes[start + t]);
      CHECK(tg[t] == bytes[start + t + 1]);
    }
  }
}

TEST_CASE("micro_batch(step r j) holds global samples step*B + r*B/D + j*B/(D*M) + i", "[data]") {
  TempDir tmp;
  std::string path;
  write_corpus(tmp, 1000, &path);
  const int T = 8, B = 12, D = 2, M = 3, per_mb = B / (D * M);
  for (bool shuffle : {false, true}) {
    Dataset ds(text_spec(path, shuffle)), ref(text_spec(path, shuffle));
    std::vector<int> in(per_mb * T), tg(per_mb * T), s_in(T), s_tg(T);
    for (int64_t step = 0; step < 30; step += 3)
      for (int r = 0; r < D; ++r)
        for (int j = 0; j < M; ++j) {
          INFO("shuffle=" << shuffle << " step=" << step << " r=" << r << " j=" << j);
          ds.micro_batch(step, r, j, in.data(), tg.data());
          for (int i = 0; i < per_mb; ++i) {
            ref.sample(step * B + r * B / D + j * per_mb + i, s_in.data(), s_tg.data());
            CHECK(std::equal(s_in.begin(), s_in.end(), in.begin() + i * T));
            CHECK(std::equal(s_tg.begin(), s_tg.end(), tg.begin() + i * T));
          }
        }
  }
}

TEST_CASE("shuffled epochs are seeded permutations of the stride-T windows that differ per epoch", "[data]") {
  TempDir tmp;
  std::string path;
  const size_t N = 1000;
  const int T = 8;
  const int64_t E = (N - T - 1) / T;  // 123 windows per epoch
  write_corpus(tmp, N, &path);
  Dataset ds(text_spec(path, true));
  std::vector<size_t> all;
  for (int64_t i = 0; i < E; ++i) all.push_back(static_cast<size_t>(i) * T);

  std::vector<std::vector<size_t>> epochs;
  for (int64_t e = 0; e < 3; ++e) {
    INFO("epoch " << e);
    epochs.push_back(epoch_windows(ds, e, E));
    auto sorted = epochs.back();
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == all);
  }
  CHECK(epochs[0] != all);  // actually shuffled
  CHECK(epochs[0] != epochs[1]);
  CHECK(epochs[1] != epochs[2]);
  // Revisiting an earlier epoch (out of order) gives the same windows again.
  CHECK(epoch_windows(ds, 0, E) == epochs[0]);
  CHECK(ds.window_start(2 * E + 5) == epochs[2][5]);
  CHECK(ds.window_start(5) == epochs[0][5]);

  Dataset same(text_spec(path, true)), other(text_spec(path, true, 99));
  for (int64_t e = 0; e < 3; ++e) CHECK(epoch_windows(same, e, E) == epochs[e]);
  CHECK(epoch_windows(other, 0, E) != epochs[0]);

  // Samples follow the shuffled window: targets are the inputs shifted by one.
  std::vector<int> in(T), tg(T);
  ds.sample(17, in.data(), tg.data());
  for (int t = 0; t + 1 < T; ++t) CHECK(tg[t] == in[t + 1]);
}

TEST_CASE("synthetic corpus is deterministic per seed and looks like text", "[data]") {
  const size_t n = 20000;
  auto a = synthetic_corpus(7, n), b = synthetic_corpus(7, n), c = synthetic_corpus(8, n);
  REQUIRE(a.size() == n);
  CHECK(a == b);
  CHECK(a != c);
  size_t texty = 0, lower = 0, dots = 0, newlines = 0, spaces = 0;
  for (uint8_t x : a) {
    bool is_lower = x >= 'a' && x <= 'z';
    lower += is_lower;
    dots += x == '.';
    newlines += x == '\n';
    spaces += x == ' ';
    texty += is_lower || x == ' ' || x == '.' || x == '\n';
  }
  CHECK(texty >= n * 99 / 100);
  CHECK(lower > n / 2);
  CHECK(spaces > 0);
  CHECK(dots > 0);
  CHECK(newlines > 0);
  // A shorter corpus is a prefix of a longer one with the same seed.
  auto shorter = synthetic_corpus(7, 1000);
  CHECK(std::equal(shorter.begin(), shorter.end(), a.begin()));
}

TEST_CASE("the synthetic source serves the corpus of run.seed", "[data]") {
  RunSpec spec = load_spec("", {"run.seed=5", "data.shuffle=false"}, 0);
  Dataset ds(spec);
  REQUIRE(ds.n_tokens() == Dataset::kSyntheticBytes);
  auto corpus = synthetic_corpus(5, Dataset::kSyntheticBytes);
  const int T = spec.model.seq_len;
  std::vector<int> in(T), tg(T);
  for (int64_t g : {0, 1, 1000, 123456}) {
    size_t start = ds.window_start(g);
    ds.sample(g, in.data(), tg.data());
    for (int t = 0; t < T; ++t) {
      CHECK(in[t] == corpus[start + t]);
      CHECK(tg[t] == corpus[start + t + 1]);
    }
  }
}

TEST_CASE("a missing or too-short data file is a SpecError naming data.path", "[data]") {
  TempDir tmp;
  const std::string missing = (tmp.dir / "does_not_exist.txt").string();
  std::string msg = spec_error(text_spec(missing, false));
  CHECK_THAT(msg, Contains("data.path"));
  CHECK_THAT(msg, Contains("does_not_exist.txt"));

  const std::string short_path = (tmp.dir / "short.txt").string();
  std::ofstream(short_path, std::ios::binary) << std::string(9, 'x');  // seq_len + 1 bytes
  msg = spec_error(text_spec(short_path, false));
  CHECK_THAT(msg, Contains("data.path"));
  CHECK_THAT(msg, Contains("short.txt"));

  const std::string ok_path = (tmp.dir / "ok.txt").string();
  std::ofstream(ok_path, std::ios::binary) << "0123456789";  // exactly seq_len + 2 bytes
  for (bool shuffle : {false, true}) {
    Dataset ds(text_spec(ok_path, shuffle));
    std::vector<int> in(8), tg(8);
    for (int64_t g = 0; g < 5; ++g) {
      CHECK(ds.window_start(g) == 0);
      ds.sample(g, in.data(), tg.data());
      CHECK(in[0] == '0');
      CHECK(tg[7] == '8');
    }
  }
}
