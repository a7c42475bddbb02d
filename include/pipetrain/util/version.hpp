// Which pipetrain this is: the release version (CMake's project version) and the build id (`git
// describe` of the source tree at build time, "-dirty" with uncommitted changes), printed by
// `pipetrain --version` and written wherever a run records what made it.
#pragma once
#include <string>

namespace pipetrain {

const char* build_id();        // e.g. "d9526e0a1b2c-dirty"; "unknown" without git
std::string version_string();  // "pipetrain 0.9.0 (build d9526e0a1b2c)"

}  // namespace pipetrain
