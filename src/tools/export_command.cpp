// `pipetrain export`: its command line; the work is interop's (interop/model_export).
#include "pipetrain/tools/export_command.hpp"

#include <cstdio>

#include "pipetrain/interop/model_export.hpp"
#include "pipetrain/tools/cli.hpp"

namespace pipetrain {

ExitCode export_command(const std::vector<std::string>& args) {
  ModelExportOptions opt;
  std::string format, dtype;
  po::options_description desc("pipetrain export --checkpoint PATH --format hf|llmc --output OUT [options]   (no MPI)");
  desc.add_options()("help,h", "show this help")("checkpoint", po::value<std::string>(&opt.checkpoint),
                                                 "a checkpoint (any saved layout), or a run directory, its checkpoints "
                                                 "folder or latest file: the newest intact one")(
      "format", po::value<std::string>(&format),
      "hf (a Hugging Face GPT-2 or Llama directory, by model.arch: config.json, model.safetensors) | llmc (llm.c's "
      "model file, GPT-2 only)")("output", po::value<std::string>(&opt.output),
                                 "the directory (hf) or file (llmc) to write")(
      "dtype", po::value<std::string>(&dtype)->default_value("fp32"), "fp32 | bf16 (rounded to nearest even)")(
      "force", "replace an existing output");
  po::variables_map vm;
  if (auto done = parse_command_line("export", desc, args, vm)) return *done;
  if (opt.checkpoint.empty() || format.empty()) {
    std::fprintf(stderr,
                 "pipetrain export: error: %s (pipetrain export --checkpoint PATH --format hf|llmc --output OUT)\n",
                 opt.checkpoint.empty() ? "which checkpoint?" : "which format?");
    return ExitCode::bad_input;
  }
  opt.force = vm.count("force") > 0;
  return run_offline([&] {
    opt.format = parse_choice("export: --format", format, {ExportFormat::hf, ExportFormat::llmc});
    opt.dtype = parse_choice("export: --dtype", dtype, {Dtype::fp32, Dtype::bf16});
    return run_export(opt);
  });
}

}  // namespace pipetrain
