// Token files of every width (docs/design.md, "Token file format"): what the writer stores reads
// back as the same ids, in the narrowest width for the vocabulary; ids at or above the vocabulary
// are refused naming where; an abandoned write leaves nothing; long lines are cut for encoding
// without splitting a UTF-8 character.
#include <catch2/catch.hpp>

#include <filesystem>
#include <random>
#include <string>

#include "pipetrain/data/dataset.hpp"
#include "pipetrain/data/tokenizer.hpp"
#include "pipetrain/util/errors.hpp"
#include "temp_dir.hpp"

using namespace pipetrain;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

std::string write_tokens(const TempDir& tmp, int64_t vocab, const std::vector<uint32_t>& ids, uint64_t val) {
  TokenFileWriter::Options o;
  o.output = (tmp.dir / ("t" + std::to_string(vocab) + ".h5")).string();
  o.vocab = vocab;
  o.width = token_width_for(vocab);
  o.what = "test";
  TokenFileWriter w(o, ids.size() - val, val);
  w.append(ids.data(), ids.size() / 2, "ids", 0);  // two appends straddling nothing in particular
  w.append(ids.data() + ids.size() / 2, ids.size() - ids.size() / 2, "ids", ids.size() / 2);
  w.commit(sources_json({}, "test", ""));
  return o.output;
}

}  // namespace

TEST_CASE("token widths are the narrowest for the vocabulary", "[data]") {
  CHECK(token_width_for(256) == 1);
  CHECK(token_width_for(257) == 2);
  CHECK(token_width_for(65536) == 2);
  CHECK(token_width_for(65537) == 4);
  CHECK(token_width_for(128256) == 4);
}

TEST_CASE("uint8, uint16 and uint32 token files read back the ids written, split into train and val", "[data]") {
  TempDir tmp;
  for (int64_t vocab : {256, 50257, 200000}) {
    std::mt19937 gen(static_cast<unsigned>(vocab));
    std::vector<uint32_t> ids(5000);
    for (auto& id : ids) id = gen() % vocab;
    ids[17] = static_cast<uint32_t>(vocab - 1);  // the largest id survives narrowing
    const std::string path = write_tokens(tmp, vocab, ids, 1000);
    const TokenFileInfo info = read_token_file_info(path);
    CHECK(info.width == token_width_for(vocab));
    CHECK(info.vocab_size == vocab);
    CHECK(info.train == 4000);
    CHECK(info.val == 1000);
    std::vector<uint32_t> train(4000), val(1000);
    TokenFile(path, Split::train).read(0, 4000, train.data());
    TokenFile(path, Split::val).read(0, 1000, val.data());
    CHECK(std::equal(train.begin(), train.end(), ids.begin()));
    CHECK(std::equal(val.begin(), val.end(), ids.begin() + 4000));
  }
}

TEST_CASE("an id at or above the vocabulary is refused when written, naming the source and offset", "[data]") {
  TempDir tmp;
  TokenFileWriter::Options o;
  o.output = (tmp.dir / "bad.h5").string();
  o.vocab = 1000;
  o.width = 2;
  o.what = "test";
  std::vector<uint32_t> ids(100, 5);
  ids[42] = 1000;
  {
    TokenFileWriter w(o, 100, 0);
    REQUIRE_THROWS_WITH(w.append(ids.data(), ids.size(), "corpus.bin", 7),
                        Contains("corpus.bin") && Contains("token 49") && Contains("1000"));
  }
  CHECK(fs::is_empty(tmp.dir));  // the abandoned write left nothing
}

TEST_CASE("training windows over a wide token file widen the ids to ints", "[data]") {
  TempDir tmp;
  std::vector<uint32_t> ids(400);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint32_t>(60000 + i);  // > 32767: no sign mix-ups
  const std::string path = write_tokens(tmp, 65536, ids, 0);
  const RunSpec spec = load_spec("",
                                 {"data.source=hdf5", "data.path=" + path, "data.shuffle=false", "model.vocab=65536",
                                  "model.seq_len=8", "train.global_batch=4", "parallel.micro_batches=1"},
                                 0);
  Dataset ds(spec);
  std::vector<int> in(8), out(8);
  ds.sample(3, in.data(), out.data());  // window 3 starts at 24
  for (int t = 0; t < 8; ++t) {
    CHECK(in[t] == 60024 + t);
    CHECK(out[t] == 60025 + t);
  }
}

TEST_CASE("long lines are cut for encoding at a space, else never inside a UTF-8 character", "[data]") {
  const std::string spaced = std::string(70000, 'a') + " " + std::string(10, 'b');
  auto pieces = encoding_pieces(spaced);
  REQUIRE(pieces.size() == 2);
  CHECK(pieces[0].size() == 65536);  // no space within the first 64 KiB: a hard cut
  CHECK(pieces[0] + pieces[1] == spaced);
  std::string utf8;
  while (utf8.size() < 70000) utf8 += "\xE6\x9D\xB1";  // a 3-byte character, 64 KiB not a multiple of 3
  pieces = encoding_pieces(utf8);
  REQUIRE(pieces.size() == 2);
  CHECK(pieces[0].size() % 3 == 0);
  CHECK(pieces[0] + pieces[1] == utf8);
  CHECK(encoding_pieces("short line").size() == 1);
  const std::string words = std::string(60000, 'a') + " " + std::string(10000, 'b');
  pieces = encoding_pieces(words);
  REQUIRE(pieces.size() == 2);
  CHECK(pieces[0].size() == 60000);  // cut before the space, which starts the next piece
  CHECK(pieces[1] == " " + std::string(10000, 'b'));
}

TEST_CASE("decoding bytes keeps them and shows an id beyond the tokenizer as <id>", "[data]") {
  const Tokenizer bytes;
  CHECK(bytes.decode({104, 105, 0, 255}) == std::string("hi\0\xff", 4));
  CHECK(bytes.decode({104, 256, 105, 1000}) == "h<256>i<1000>");
}
