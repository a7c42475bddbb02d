// Data mixtures (data/mixture.hpp): the constant-memory shuffle is a bijection; the weights'
// pattern gives each source its share (within one sample of every prefix of a block) and numbers
// each source's samples 0, 1, 2, ... without gap or repeat; a mixture over real token files reads
// each global sample from the source the pattern deals it, whatever order the samples are read in
// (as different layouts and resumes read them); a source's files are found by path, glob or
// folder; the spec's [[data.sources]] is read, checked and shown.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "pipetrain/config/spec.hpp"
#include "pipetrain/data/corpus_formats.hpp"
#include "pipetrain/data/corpus_index.hpp"
#include "pipetrain/data/dataset.hpp"
#include "pipetrain/data/index_permutation.hpp"
#include "pipetrain/data/mixture.hpp"
#include "pipetrain/util/errors.hpp"
#include "temp_dir.hpp"

using namespace pipetrain;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// A token file whose train tokens are base, base + 1, ..., base + n - 1 (ids below 256), so a
// window says where it came from; `val` tokens likewise from base + 128.
std::string token_file(const TempDir& tmp, const std::string& name, uint32_t base, size_t n, size_t val = 0) {
  TokenFileWriter::Options o;
  o.output = (tmp.dir / name).string();
  o.vocab = 256;
  o.what = "test";
  TokenFileWriter w(o, n, val);
  std::vector<uint32_t> ids;
  for (size_t i = 0; i < n; ++i) ids.push_back(base + static_cast<uint32_t>(i) % 64);
  for (size_t i = 0; i < val; ++i) ids.push_back(base + 128 + static_cast<uint32_t>(i) % 64);
  w.append(ids.data(), ids.size(), "ids", 0);
  w.commit(sources_json({}, "test", ""));
  return o.output;
}

// An llm.c shard (version 1: 16-bit ids) of ids base, base + 1, ..., base + n - 1.
std::string llmc_shard(const TempDir& tmp, const std::string& name, uint32_t base, size_t n) {
  std::vector<int32_t> header(256, 0);
  header[0] = kLlmcMagic16;
  header[1] = 1;
  header[2] = static_cast<int32_t>(n);
  std::vector<uint16_t> ids;
  for (size_t i = 0; i < n; ++i) ids.push_back(static_cast<uint16_t>(base + i));
  std::string bytes(reinterpret_cast<const char*>(header.data()), header.size() * 4);
  bytes.append(reinterpret_cast<const char*>(ids.data()), ids.size() * 2);
  return tmp.write(name, bytes);
}

// A small model over `sources`; `more` overrides come last (model.vocab=...).
RunSpec mixture_spec(const std::string& sources, const std::vector<std::string>& more = {}) {
  std::vector<std::string> sets = {"model.seq_len=4",        "model.n_layer=1", "model.d_model=8",
                                   "model.n_head=2",         "model.vocab=256", "train.global_batch=8",
                                   "data.sources=" + sources};
  sets.insert(sets.end(), more.begin(), more.end());
  return parse_spec("", "", sets, 1);
}

}  // namespace

TEST_CASE("mixture: the constant-memory shuffle is a seeded bijection", "[data][mixture]") {
  for (uint64_t n : {1u, 2u, 3u, 7u, 100u, 1000u, 4097u}) {
    std::set<uint64_t> images;
    for (uint64_t i = 0; i < n; ++i) images.insert(permute_index(i, n, 42));
    CHECK(images.size() == n);
    CHECK(*images.rbegin() < n);
  }
  int moved = 0, differs = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    moved += permute_index(i, 1000, 42) != i;
    differs += permute_index(i, 1000, 42) != permute_index(i, 1000, 43);
    CHECK(permute_index(i, 1000, 42) == permute_index(i, 1000, 42));
  }
  CHECK(moved > 950);  // a shuffle, not the identity
  CHECK(differs > 950);
}

TEST_CASE("mixture: each source's share within one sample, its samples numbered without gap", "[data][mixture]") {
  const std::vector<double> weights = {5, 3, 2};
  const MixturePattern pattern(weights);
  const int64_t n = 3 * MixturePattern::kBlock + 10000;
  std::vector<int64_t> taken(3);
  for (int64_t g = 0; g < n; ++g) {
    const MixturePattern::Pick p = pattern.pick(g);
    REQUIRE(p.index == taken[p.source]);  // the source's next sample
    ++taken[p.source];
    if (g + 1 == 10000 || g % MixturePattern::kBlock == 777)
      for (int s = 0; s < 3; ++s)
        CHECK(std::abs(taken[s] - weights[s] / 10 * (g % MixturePattern::kBlock + 1) -
                       (g / MixturePattern::kBlock) * pattern.per_block(s)) < 1.0 + 1e-9);
  }
  for (int s = 0; s < 3; ++s) CHECK(std::abs(static_cast<double>(taken[s]) / n - weights[s] / 10) < 1e-4);
  CHECK_THROWS_AS(MixturePattern({1, 1e-6}), std::invalid_argument);
}

TEST_CASE("mixture: samples come from the source dealt them, in any reading order", "[data][mixture]") {
  TempDir tmp;
  token_file(tmp, "web_0.h5", 0, 201);
  token_file(tmp, "web_1.h5", 0, 101);  // web: two shards, 50 + 25 windows of 5 tokens at stride 4
  std::filesystem::create_directories(tmp.dir / "code");
  token_file(tmp, "code/a.h5", 64, 41, 41);  // code: a folder, 10 windows
  tmp.write("code/README", "not a token file");
  const std::string sources = "[{path = \"" + (tmp.dir / "web_*.h5").string() + "\", weight = 3}, {path = \"" +
                              (tmp.dir / "code").string() + "\", weight = 1}]";
  const RunSpec spec = mixture_spec(sources);
  CHECK(spec.data.source == DataSource::hdf5);
  REQUIRE(spec.data.sources.size() == 2);
  CHECK(spec.data.sources[0].name == "web");
  CHECK(spec.data.sources[1].name == "code");

  Mixture forward(spec, Split::train), backward(spec, Split::train);
  CHECK(forward.source(0).windows() == 75);
  CHECK(forward.source(1).windows() == 10);
  const int64_t n = 400;
  std::vector<std::vector<uint32_t>> read(n, std::vector<uint32_t>(5));
  for (int64_t g = n - 1; g >= 0; --g) backward.sample(g, read[g].data());
  std::map<int, std::set<std::pair<size_t, size_t>>> seen;  // per source, the windows of its first epoch
  std::vector<int64_t> taken(2);
  for (int64_t g = 0; g < n; ++g) {
    std::vector<uint32_t> w(5);
    forward.sample(g, w.data());
    CHECK(w == read[g]);
    const MixturePattern::Pick p = forward.pick(g);
    CHECK(w[0] / 64 == static_cast<uint32_t>(p.source));  // web's ids are below 64, code's from 64
    const TokenSource::Where at = forward.source(p.source).where(p.index);
    if (p.index < forward.source(p.source).windows()) seen[p.source].insert({at.file, at.start});
    ++taken[p.source];
  }
  CHECK(seen[0].size() == 75);  // an epoch is every window once
  CHECK(seen[1].size() == 10);
  // Shuffled: the web source's first epoch is not its files' order; unshuffled, it is.
  const auto position = [](const TokenSource& src, int64_t j) {
    const TokenSource::Where at = src.where(j);
    return static_cast<int64_t>(at.file * 50 + at.start / 4);  // web_0 holds windows 0-49
  };
  const Mixture in_order(mixture_spec(sources, {"data.shuffle=false"}), Split::train);
  int moved = 0;
  for (int64_t j = 0; j < 75; ++j) {
    CHECK(position(in_order.source(0), j) == j);
    moved += position(forward.source(0), j) != j;
  }
  CHECK(moved > 60);
  CHECK(taken[0] == 300);
  CHECK(taken[1] == 100);

  // The held-out split reads each source's /val, in order; web has none.
  CHECK_THROWS_WITH(Mixture(spec, Split::val), Contains("data.sources[0] (web)"));
  const RunSpec code_only = mixture_spec("[{path = \"" + (tmp.dir / "code").string() + "\"}]", {"eval.every_steps=1"});
  Dataset val(code_only, Split::val);
  CHECK(val.repeats_within(10).empty());
  CHECK_THAT(val.repeats_within(11), Contains("data.sources[0]'s share is 11 of them"));
}

TEST_CASE("mixture: a source's path is a file, a glob or a folder, and says when it names nothing", "[data][mixture]") {
  TempDir tmp;
  const std::string b = token_file(tmp, "b.h5", 0, 50), a = token_file(tmp, "a.h5", 0, 50);
  CHECK(source_files((tmp.dir / "*.h5").string()) == std::vector<std::string>{a, b});
  CHECK(source_files(tmp.dir.string()) == std::vector<std::string>{a, b});
  CHECK(source_files(a) == std::vector<std::string>{a});
  CHECK_THROWS_WITH(source_files((tmp.dir / "*.bin").string()), Contains("no file matches"));
  std::filesystem::create_directories(tmp.dir / "empty");
  CHECK_THROWS_WITH(source_files((tmp.dir / "empty").string()), Contains("without token files"));
  const RunSpec spec = mixture_spec("[{path = \"" + (tmp.dir / "c.h5").string() + "\"}]");
  CHECK_THROWS_WITH(Dataset(spec), Contains("data.sources[0] (c)"));
}

TEST_CASE("mixture: [[data.sources]] is read, checked and shown", "[data][mixture][config]") {
  const RunSpec spec =
      mixture_spec(R"([{path = "d/web/*.h5", weight = 0.7}, {path = "code.h5", weight = 0.3, name = "c"}])");
  CHECK(spec.data.sources[0].name == "web");
  CHECK(spec.data.sources[0].weight == 0.7);
  CHECK(spec.data.sources[1].name == "c");
  const std::string shown = resolved_toml(spec);
  CHECK_THAT(shown, Contains(R"(sources = [{ path = "d/web/*.h5", weight = 0.7, name = "web" })"));
  CHECK(parse_spec(shown, "shown.toml", {}, 1).data.sources.size() == 2);  // what is shown reads back

  CHECK_THROWS_WITH(mixture_spec(R"([{path = "a.h5", wieght = 2}])"),
                    Contains("unknown key wieght") && Contains("weight"));
  CHECK_THROWS_WITH(mixture_spec(R"([{path = "a.h5", weight = 0}])"),
                    Contains("data.sources[0].weight must be a number > 0"));
  CHECK_THROWS_WITH(mixture_spec(R"([{weight = 1}])"), Contains("data.sources[0] has no path"));
  CHECK_THROWS_WITH(mixture_spec(R"([{path = "a/x.h5"}, {path = "b/x.h5"}])"), Contains("two sources are named \"x\""));
  CHECK_THROWS_WITH(mixture_spec(R"(["a.h5"])"), Contains("data.sources[0] must be a table"));
  CHECK_THROWS_WITH(mixture_spec(R"([{path = "a.h5"}])", {"data.path=b.h5"}), Contains("data.path and data.sources"));
  CHECK_THROWS_WITH(mixture_spec(R"([{path = "a.h5"}])", {"data.source=text"}), Contains("data.source = \"text\""));
}

TEST_CASE("mixture: llm.c shards are read in place, their held-out shards named by val", "[data][mixture]") {
  TempDir tmp;
  std::filesystem::create_directories(tmp.dir / "fineweb");
  llmc_shard(tmp, "fineweb/train_000.bin", 0, 41);
  llmc_shard(tmp, "fineweb/train_001.bin", 1000, 21);  // 10 + 5 windows of 5 tokens at stride 4
  llmc_shard(tmp, "val_000.bin", 5000, 9);             // 2 windows
  const std::string folder = (tmp.dir / "fineweb").string(), val = (tmp.dir / "val_000.bin").string();
  const RunSpec spec = mixture_spec("[{path = \"" + folder + "\", val = \"" + val + "\"}]", {"model.vocab=6000"});
  CHECK(spec.data.sources[0].val == val);
  Mixture train(spec, Split::train), held_out(spec, Split::val);
  CHECK(train.source(0).windows() == 15);
  CHECK(held_out.source(0).windows() == 2);
  std::set<uint32_t> firsts;
  for (int64_t g = 0; g < 15; ++g) {
    std::vector<uint32_t> w(5);
    train.sample(g, w.data());
    for (int t = 1; t < 5; ++t) CHECK(w[t] == w[0] + static_cast<uint32_t>(t));  // consecutive ids of one shard
    firsts.insert(w[0]);
  }
  CHECK(firsts.size() == 15);  // every window once in the first epoch
  CHECK(firsts.count(1000) == 1);
  std::vector<uint32_t> w(5);
  held_out.sample(1, w.data());
  CHECK(w[0] == 5004);  // in order

  // Without val, an llm.c source has nothing held out; an id over model.vocab is named where it lies.
  const RunSpec no_val = mixture_spec("[{path = \"" + folder + "\"}]", {"model.vocab=6000"});
  CHECK_THROWS_WITH(Mixture(no_val, Split::val), Contains("llm.c shards hold no held-out split"));
  Mixture small(mixture_spec("[{path = \"" + folder + "\"}]", {"model.vocab=1010"}), Split::train);
  bool named = false;
  for (int64_t g = 0; g < 15 && !named; ++g) try {
      small.sample(g, w.data());
    } catch (const SpecError& e) {
      named = std::string(e.what()).find("train_001.bin: token id 10") != std::string::npos &&
              std::string(e.what()).find("model.vocab = 1010") != std::string::npos;
    }
  CHECK(named);

  // Imported ids (tokenizer "none") mix with llm.c shards; byte tokens do not.
  TokenFileWriter::Options o;
  o.output = (tmp.dir / "imported.h5").string();
  o.vocab = 6000;
  o.width = 2;
  o.tokenizer = TokenizerKind::none;
  o.what = "test";
  {
    TokenFileWriter writer(o, 50, 0);
    std::vector<uint32_t> ids(50, 7);
    writer.append(ids.data(), ids.size(), "ids", 0);
    writer.commit(sources_json({}, "test", ""));
  }
  CHECK_NOTHROW(
      Mixture(mixture_spec("[{path = \"" + o.output + "\"}, {path = \"" + folder + "\"}]", {"model.vocab=6000"}),
              Split::train));
  const std::string bytes = token_file(tmp, "bytes.h5", 0, 50);
  CHECK_THROWS_WITH(
      Mixture(mixture_spec("[{path = \"" + bytes + "\"}, {path = \"" + folder + "\"}]", {"model.vocab=6000"}),
              Split::train),
      Contains("tokenized otherwise"));
}

TEST_CASE("a corpus's files are known from their folder's index until one changes", "[mixture]") {
  TempDir tmp;
  std::vector<std::string> files;
  for (int i = 0; i < 5; ++i) files.push_back(token_file(tmp, "t" + std::to_string(i) + ".h5", i, 100 + i, 10));
  files.push_back(llmc_shard(tmp, "s.bin", 3, 77));
  size_t opened = 0;
  const std::vector<CorpusFile> first = corpus_files(files, "auto", &opened);
  CHECK(opened == 6);
  CHECK(fs::exists(tmp.dir / kIndexName));
  CHECK(first[2].train == 102);
  CHECK(first[2].val == 10);
  CHECK(first[2].tokenizer == TokenizerKind::bytes);
  CHECK(first[5].raw_width == 2);
  CHECK(first[5].train == 77);
  const std::vector<CorpusFile> again = corpus_files(files, "auto", &opened);
  CHECK(opened == 0);  // every entry current: no file opened
  CHECK(again[2].train == 102);
  CHECK(again[5].train == 77);

  fs::remove(files[2]);
  token_file(tmp, "t2.h5", 2, 300, 10);  // rewritten: another size and date
  const std::vector<CorpusFile> changed = corpus_files(files, "auto", &opened);
  CHECK(opened == 1);
  CHECK(changed[2].train == 300);

  tmp.write(kIndexName, "{not json");  // a damaged index is rebuilt, never trusted
  CHECK(corpus_files(files, "auto", &opened)[2].train == 300);
  CHECK(opened == 6);
  CHECK(corpus_files(files, "auto", &opened).size() == 6);
  CHECK(opened == 0);

  const std::string other = tmp.write("notes.txt", "not tokens");
  CHECK_THROWS_WITH(corpus_files({files[0], other}), Contains("notes.txt"));
}

TEST_CASE("nanoGPT files and Megatron datasets are read in place, window for window as the token file", "[mixture]") {
  TempDir tmp;
  const std::string h5 = token_file(tmp, "t.h5", 5, 500);
  std::vector<uint16_t> ids;  // the same ids: headerless uint16 (nanoGPT), and a Megatron dataset
  for (size_t i = 0; i < 500; ++i) ids.push_back(static_cast<uint16_t>(5 + i % 64));
  const std::string nano =
      tmp.write("n.bin", std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(uint16_t)));
  TokenExportOptions e;
  e.input = h5;
  e.output = (tmp.dir / "mega").string();
  e.format = CorpusFormat::megatron;
  export_tokens(e);
  const int T = 16;
  TokenSource token_file_source({h5}, Split::train, T, true, 9, 256, "t");
  TokenSource nanogpt({nano}, Split::train, T, true, 9, 256, "n", "nanogpt");
  TokenSource megatron(source_files(e.output, "megatron"), Split::train, T, true, 9, 256, "m", "megatron");
  CHECK(source_files(e.output + ".idx", "megatron") == std::vector<std::string>{e.output + ".bin"});
  CHECK(source_files(tmp.dir.string(), "megatron") == std::vector<std::string>{e.output + ".bin"});
  REQUIRE(nanogpt.windows() == token_file_source.windows());
  REQUIRE(megatron.windows() == token_file_source.windows());
  std::vector<uint32_t> want(T + 1), got(T + 1);
  for (int64_t j = 0; j < 2 * token_file_source.windows(); ++j) {
    token_file_source.read(j, want.data());
    nanogpt.read(j, got.data());
    CHECK(got == want);
    megatron.read(j, got.data());
    CHECK(got == want);
  }
  // Nothing bounds a raw file's ids: each is checked against model.vocab as it is read.
  TokenSource small({nano}, Split::train, T, false, 9, 40, "n", "nanogpt");
  CHECK_THROWS_WITH(small.read(2, got.data()),
                    Contains("n.bin: token id 40 at offset 35") && Contains("model.vocab = 40"));
  CHECK_THROWS_WITH(TokenSource({nano + "x"}, Split::train, T, false, 9, 256, "n", "megatron"), Contains("n.binx"));
}

TEST_CASE("a raw file's next windows are read ahead into the page cache", "[mixture]") {
  // A nanoGPT file out of the page cache (posix_fadvise DONTNEED), then prefetch of one window:
  // its pages become resident (mincore) without a read. Where the file system keeps every page
  // resident (tmpfs) there is nothing to observe.
  TempDir tmp;
  const size_t n = 4u << 20;  // 8 MiB of ids
  const std::vector<uint16_t> ids(n, 7);
  const std::string path =
      tmp.write("n.bin", std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(uint16_t)));
  const int T = 1 << 18;  // a window: 512 KiB
  TokenSource src({path}, Split::train, T, false, 1, 256, "n", "nanogpt");
  const int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  const size_t bytes = n * sizeof(uint16_t), page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  REQUIRE(map != MAP_FAILED);
  auto resident = [&](size_t from, size_t len) {  // pages of [from, from + len) in the page cache
    std::vector<unsigned char> in((len + page - 1) / page);
    ::mincore(static_cast<char*>(map) + from, len, in.data());
    return static_cast<size_t>(std::count_if(in.begin(), in.end(), [](unsigned char c) { return c & 1; }));
  };
  const size_t window = (static_cast<size_t>(T) + 1) * sizeof(uint16_t), at = 5 * static_cast<size_t>(T) * 2;
  const size_t first = at / page * page, pages = (at + window - first + page - 1) / page;
  if (resident(first, pages * page) == pages) {
    WARN("the file system keeps the file's pages resident: read-ahead cannot be observed here");
  } else {
    src.prefetch(5);  // window 5 starts at token 5 T
    size_t got = 0;
    for (int i = 0; i < 200 && got < pages; ++i, std::this_thread::sleep_for(std::chrono::milliseconds(10)))
      got = resident(first, pages * page);
    CHECK(got == pages);
    CHECK(resident(0, page) == 0);  // the file's head was not asked for
  }
  ::munmap(map, bytes);
  ::close(fd);
}
