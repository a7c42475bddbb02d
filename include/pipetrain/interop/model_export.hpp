// `pipetrain export`: a checkpoint of any layout as a model other tools load — a Hugging Face
// GPT-2 directory (config.json, model.safetensors, and the checkpoint's tokenizer.model when it
// has one) or an llm.c model file. One process, no MPI; the output appears whole or not at all.
#pragma once
#include <string>

#include "pipetrain/config/choices.hpp"

#include "pipetrain/util/errors.hpp"

namespace pipetrain {

struct ModelExportOptions {
  std::string checkpoint;  // a checkpoint directory
  ExportFormat format = ExportFormat::hf;
  std::string output;         // the directory (hf) or file (llmc) to write
  Dtype dtype = Dtype::fp32;  // bf16: rounded to nearest even
  bool force = false;         // replace an existing output
};

// Bad input (not a checkpoint, an unknown format or dtype, an existing output without force, an
// untied model for llm.c) is a SpecError naming it; a failed write removes what it wrote.
ExitCode run_export(const ModelExportOptions& opt);

}  // namespace pipetrain
