// What data prepare reads (text_inputs.hpp): blocks cut at line ends whatever the block size, the
// documents' ends (files, paragraphs, JSON Lines records), gzip read as it decompresses, globs.
#include <catch2/catch.hpp>

#include <zlib.h>

#include <string>
#include <vector>

#include "pipetrain/data/text_inputs.hpp"
#include "pipetrain/util/errors.hpp"
#include "temp_dir.hpp"

using namespace pipetrain;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// The whole file through blocks of `bytes`: its text, and the documents as the ends cut it.
struct Read {
  std::string text;
  std::vector<std::string> documents;
  std::vector<std::string> blocks;
};
Read read_all(const std::string& path, DocumentSplit split, size_t bytes) {
  TextInput in(path, split);
  Read r;
  TextBlock b;
  std::string open;
  while (in.next(b, bytes)) {
    r.blocks.push_back(b.text);
    size_t from = 0;
    for (size_t end : b.ends) {
      r.documents.push_back(open + b.text.substr(from, end - from));
      open.clear();
      from = end;
    }
    open += b.text.substr(from);
    r.text += b.text;
  }
  if (!open.empty()) r.documents.push_back(open + "|open");
  return r;
}

std::string gzip_file(const TempDir& tmp, const std::string& name, const std::string& text) {
  const std::string path = (tmp.dir / name).string();
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
  gzclose(f);
  return path;
}

}  // namespace

TEST_CASE("text comes in blocks cut at line ends, whole, at any block size", "[data]") {
  TempDir tmp;
  const std::string text = "one\ntwo two\n\nthree three three\n" + std::string(50, 'x') + "\nlast";
  const std::string path = tmp.write("t.txt", text);
  for (size_t bytes : {1, 4, 7, 16, 1000}) {
    INFO("blocks of " << bytes);
    const Read r = read_all(path, DocumentSplit::none, bytes);
    CHECK(r.text == text);
    CHECK(r.documents == std::vector<std::string>{text + "|open"});  // no document ends
    // a block ends a line (holding one longer than a block whole), or cuts one over 4 blocks
    for (size_t i = 0; i + 1 < r.blocks.size(); ++i) {
      const std::string& b = r.blocks[i];
      CHECK(((b.back() == '\n' && (b.size() <= bytes || b.find('\n') + 1 == b.size())) ||
             (b.size() <= 4 * bytes && b.find('\n') == std::string::npos)));
    }
  }
}

TEST_CASE("a line over 4 blocks is cut after a space, or between UTF-8 characters", "[data]") {
  TempDir tmp;
  const std::string euro = "\xe2\x82\xac";  // three bytes
  std::string line;
  for (int i = 0; i < 10; ++i) line += euro;
  const Read r = read_all(tmp.write("u.txt", line + "\n"), DocumentSplit::none, 4);  // cut within 16 bytes
  REQUIRE(r.blocks.size() > 1);
  for (const std::string& b : r.blocks) CHECK(b.size() % 3 == (b.back() == '\n' ? 1u : 0u));  // whole characters
  CHECK(r.text == line + "\n");
  const Read spaced = read_all(tmp.write("s.txt", "aaa bbb ccc ddd eee fff\n"), DocumentSplit::none, 2);
  CHECK(spaced.blocks.front() == "aaa bbb");  // at the last space within 8 bytes (it begins the next)
}

TEST_CASE("documents end at each file's end, or after each paragraph's blank lines", "[data]") {
  TempDir tmp;
  const std::string text = "p one\nstill one\n\n\np two\r\n\r\np three\n\n";
  const std::string path = tmp.write("t.txt", text);
  for (size_t bytes : {1, 5, 1000}) {  // a paragraph's blank lines split across blocks too
    INFO("blocks of " << bytes);
    CHECK(read_all(path, DocumentSplit::file, bytes).documents == std::vector<std::string>{text});
    CHECK(read_all(path, DocumentSplit::paragraph, bytes).documents ==
          std::vector<std::string>{"p one\nstill one\n\n\n", "p two\r\n\r\n", "p three\n\n"});
  }
  CHECK(read_all(tmp.write("empty.txt", "\n\n"), DocumentSplit::paragraph, 4).documents ==
        std::vector<std::string>{"\n\n|open"});  // blank lines alone end no document
}

TEST_CASE("JSON Lines records are documents, and gzip is read as it decompresses", "[data]") {
  TempDir tmp;
  const std::string lines =
      "{\"text\": \"a\\nb\"}\n\n{\"id\": 2, \"text\": \"c\"}\n{\"text\": \"\"}\n{\"text\": \"d\"}";
  for (const std::string& path : {tmp.write("r.jsonl", lines), gzip_file(tmp, "r.jsonl.gz", lines)}) {
    INFO(path);
    const Read r = read_all(path, DocumentSplit::none, 2);
    CHECK(r.documents == std::vector<std::string>{"a\nb", "c", "", "d"});
  }
  const std::string text = "plain\ntext\n";
  CHECK(read_all(gzip_file(tmp, "t.txt.gz", text), DocumentSplit::file, 3).documents == std::vector<std::string>{text});
  const std::string bad = tmp.write("bad.jsonl", "{\"text\": \"ok\"}\n[1, 2]\n");
  CHECK_THROWS_WITH(read_all(bad, DocumentSplit::none, 100), Contains(bad + ":2") && Contains("\"text\""));
  CHECK_THROWS_WITH(TextInput((tmp.dir / "missing.txt").string(), DocumentSplit::none), Contains("missing.txt"));
}

TEST_CASE("inputs: files, globs and folders, each expanded in name order", "[data]") {
  TempDir tmp;
  fs::create_directories(tmp.dir / "shards");
  for (const char* n : {"shards/b.jsonl", "shards/a.jsonl", "shards/c.txt", "one.txt"}) tmp.write(n, "x\n");
  const std::string d = tmp.dir.string();
  CHECK(expand_inputs({d + "/one.txt", d + "/shards/*.jsonl"}) ==
        std::vector<std::string>{d + "/one.txt", d + "/shards/a.jsonl", d + "/shards/b.jsonl"});
  CHECK(expand_inputs({d + "/shards"}) ==
        std::vector<std::string>{d + "/shards/a.jsonl", d + "/shards/b.jsonl", d + "/shards/c.txt"});
  CHECK_THROWS_WITH(expand_inputs({d + "/shards/*.parquet"}), Contains("names no file"));
  CHECK(is_jsonl("x.jsonl.gz"));
  CHECK_FALSE(is_jsonl("x.json"));
}
