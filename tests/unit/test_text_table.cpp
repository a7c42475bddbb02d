// text_table (util/text_table.hpp): columns as wide as their widest cell, UTF-8 counted by code
// point, numbers right-aligned, the last column unpadded.
#include <catch2/catch.hpp>

#include "pipetrain/util/text_table.hpp"

using namespace pipetrain;

TEST_CASE("text_table lays rows out in aligned columns", "[text_table]") {
  const std::string t = text_table(
      {{"tensor", "shape", "params"}, {"h.0.attn.q_proj.weight", "64x64", "4096"}, {"wte.weight", "256x64", "16384"}},
      "  ", {2});
  CHECK(t ==
        "  tensor                  shape   params\n"
        "  h.0.attn.q_proj.weight  64x64     4096\n"
        "  wte.weight              256x64   16384\n");
  // A multi-byte character is one column: the × below takes one place, as a terminal shows it.
  CHECK(text_table({{"grid", "ok"}, {"2×2", "yes"}}) == "grid  ok\n2×2   yes\n");
  CHECK(text_table({}).empty());
}
