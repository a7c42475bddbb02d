// `pipetrain ckpt inspect|verify PATH` (no MPI): what a checkpoint's manifest says, and whether
// the checkpoints a path names are intact. Exit codes 0 / 2 (a SpecError naming what is wrong).
#pragma once
#include <string>
#include <vector>

#include "pipetrain/util/errors.hpp"

namespace pipetrain {

// The newest checkpoint PATH names: layout, data position, shards with their tensors and sizes.
ExitCode ckpt_inspect(const std::string& path);

// One checkpoint against its manifest; for a folder of them, the newest intact one and the one
// `latest` names (which a resume or a requeued job would be pointed at).
ExitCode ckpt_verify(const std::string& path);

// `pipetrain ckpt inspect|verify PATH`: args are the words after the command.
ExitCode ckpt_command(const std::vector<std::string>& args);

}  // namespace pipetrain
