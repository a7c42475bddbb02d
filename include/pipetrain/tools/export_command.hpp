// `pipetrain export --checkpoint PATH --format hf|llmc --output OUT`: a checkpoint as a Hugging
// Face GPT-2 directory or an llm.c model file.
#pragma once
#include <string>
#include <vector>

#include "pipetrain/util/errors.hpp"

namespace pipetrain {

// args: the words after `pipetrain export`.
ExitCode export_command(const std::vector<std::string>& args);

}  // namespace pipetrain
