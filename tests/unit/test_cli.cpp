// Which commands settle their BLAS kernels (tools/cli.hpp): only those that compute.
#include <catch2/catch.hpp>

#include "pipetrain/tools/cli.hpp"

using namespace pipetrain;

TEST_CASE("only commands that compute settle their BLAS kernels", "[cli]") {
  CHECK(command_computes("train", {"--config", "configs/tiny.toml"}));
  CHECK(command_computes("eval", {"--checkpoint", "runs/tiny"}));
  CHECK(command_computes("generate", {}));
  CHECK(command_computes("smoke", {}));
  CHECK(command_computes("plan", {"--calibrate", "--output", "costs.json"}));
  // Predicting, printing and reading files compute nothing.
  CHECK_FALSE(command_computes("plan", {"--config", "configs/tiny.toml", "--world", "4"}));
  CHECK_FALSE(command_computes("plan", {"--auto", "--world", "8"}));
  for (const char* prints : {"--print-spec", "--print-run-dir", "--spec-reference", "--help"}) {
    INFO(prints);
    CHECK_FALSE(command_computes("train", {"--config", "configs/tiny.toml", prints}));
  }
  for (const char* reads : {"report", "ckpt", "data", "export"}) {
    INFO(reads);
    CHECK_FALSE(command_computes(reads, {}));
  }
}
