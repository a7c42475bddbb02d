// `pipetrain data prepare | import | export | inspect ...`: token files from text, from llm.c,
// nanoGPT and Megatron files, back to those formats, and what a token file holds.
#pragma once
#include <string>
#include <vector>

#include "pipetrain/util/errors.hpp"

namespace pipetrain {

// args: the words after `pipetrain data`.
ExitCode data_command(const std::vector<std::string>& args);

}  // namespace pipetrain
