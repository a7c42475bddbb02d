#include "pipetrain/util/version.hpp"

namespace pipetrain {

std::string version_string() { return std::string("pipetrain ") + PIPETRAIN_VERSION + " (build " + build_id() + ")"; }

}  // namespace pipetrain
