// pipetrain: the command dispatch, and the options of train and eval (each other command parses
// its own, in its file under tools/).
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "pipetrain/compute/blas_kernels.hpp"
#include "pipetrain/config/spec.hpp"
#include "pipetrain/tools/ckpt_command.hpp"
#include "pipetrain/tools/cli.hpp"
#include "pipetrain/tools/data_command.hpp"
#include "pipetrain/tools/export_command.hpp"
#include "pipetrain/tools/generate.hpp"
#include "pipetrain/tools/plan_command.hpp"
#include "pipetrain/tools/report.hpp"
#include "pipetrain/tools/smoke.hpp"
#include "pipetrain/train/run_dir.hpp"
#include "pipetrain/train/run_spec.hpp"
#include "pipetrain/train/train.hpp"
#include "pipetrain/util/version.hpp"

using namespace pipetrain;

namespace {

const char* kUsage =
    "usage: pipetrain <command> [options]\n"
    "\n"
    "commands:\n"
    "  train   train a GPT over tp x pp x dp MPI ranks with a pipeline schedule (launch with mpiexec / srun)\n"
    "  eval    --checkpoint PATH: validation loss of a checkpoint, on any layout (mpiexec / srun)\n"
    "  generate --checkpoint PATH --prompt TEXT: sample text from a checkpoint (one process, KV cache)\n"
    "  plan    predict a layout without launching it: partition, schedule chart, bubble, memory\n"
    "  ckpt    inspect | verify PATH: what a checkpoint holds / whether its shards are intact\n"
    "  report  RUN_DIR [--plots DIR] [--json]: a run's story: measured vs predicted, launches, goodput\n"
    "  smoke   cluster health check under srun/mpiexec: links, all-reduce, checkpoint I/O, training\n"
    "  data    prepare | import | export | inspect: token files (text, SentencePiece, llm.c, nanoGPT, Megatron)\n"
    "  export  --checkpoint PATH --format hf|llmc --output OUT: a checkpoint as a Hugging Face GPT-2 or llm.c model\n"
    "\n"
    "pipetrain <command> --help shows the command's options; pipetrain --version which build this is.\n";

ExitCode train_main(const std::vector<std::string>& args) {
  TrainOptions opt;
  std::string resume;
  po::options_description desc("pipetrain train [options]");
  desc.add_options()("help,h", "show this help")("config", po::value<std::string>(&opt.config),
                                                 "run spec (TOML); omitted: built-in defaults (tiny model)")(
      "set", po::value<std::vector<std::string>>(&opt.overrides)->composing(),
      "override one key: --set section.key=value (repeatable)")("run-dir", po::value<std::string>(&opt.run_dir),
                                                                "run directory (default: run.out_dir/run.name)")(
      "resume", po::value<std::string>(&resume)->default_value("auto"),
      "auto (newest intact checkpoint of the run dir, else fresh) | never | PATH (a checkpoint directory)")(
      "print-spec", "print the resolved spec (all keys and defaults) and exit")(
      "print-run-dir", "print the run directory (--run-dir, else run.out_dir/run.name) and exit; one process, no MPI")(
      "spec-reference", "print the run-spec key reference as a Markdown table and exit");
  po::variables_map vm;
  if (auto done = parse_command_line("train", desc, args, vm)) return *done;
  opt.resume = ResumeFrom::parse(resume);
  if (vm.count("spec-reference")) {
    std::cout << spec_reference_markdown();
    return ExitCode::ok;
  }
  if (vm.count("print-spec"))
    return run_offline([&] {
      std::cout << resolved_toml(load_run_spec(opt.config, opt.overrides, 0));
      return ExitCode::ok;
    });
  if (vm.count("print-run-dir"))
    return run_offline([&] {
      std::cout << resolve_run_dir(opt.run_dir, load_run_spec(opt.config, opt.overrides, 0)) << "\n";
      return ExitCode::ok;
    });
  return run_mpi([&](World& world) { return run_train(opt, world); });
}

ExitCode eval_main(const std::vector<std::string>& args) {
  TrainOptions opt;
  opt.eval_only = true;
  std::string checkpoint;  // a path: eval names its checkpoint (no auto, no never)
  po::options_description desc("pipetrain eval --checkpoint PATH [options]   (launch with mpiexec / srun)");
  desc.add_options()("help,h", "show this help")("checkpoint", po::value<std::string>(&checkpoint),
                                                 "a checkpoint (RUN_DIR/checkpoints/step_N), or a run directory, its "
                                                 "checkpoints folder or latest file: the newest intact one")(
      "config", po::value<std::string>(&opt.config),
      "run spec (TOML); omitted: the checkpoint's own, laid out as pp 1 x dp ranks")(
      "set", po::value<std::vector<std::string>>(&opt.overrides)->composing(),
      "override one key, e.g. --set parallel.pp=2 (dp fills the ranks pp leaves; repeatable)")(
      "batches", po::value<int>(&opt.eval_batches), "validation batches (default eval.batches)");
  po::variables_map vm;
  if (auto done = parse_command_line("eval", desc, args, vm)) return *done;
  if (checkpoint.empty()) {
    std::fprintf(stderr, "pipetrain eval: error: which checkpoint? (pipetrain eval --checkpoint PATH)\n");
    return ExitCode::bad_input;
  }
  if (vm.count("batches") && opt.eval_batches < 1) {
    std::fprintf(stderr, "pipetrain eval: error: --batches %d: must be at least 1\n", opt.eval_batches);
    return ExitCode::bad_input;
  }
  opt.resume = {ResumeMode::path, checkpoint};
  return run_mpi([&](World& world) { return run_train(opt, world); });
}

ExitCode dispatch(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? ExitCode::bad_input : ExitCode::ok;
  }
  if (std::string(argv[1]) == "--version" || std::string(argv[1]) == "version") {
    std::printf("%s\n", version_string().c_str());
    return ExitCode::ok;
  }
  const std::string cmd = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  // Commands that compute settle their BLAS kernels first: that may restart the process, which
  // must happen before MPI starts.
  if (command_computes(cmd, args))
    if (int refused = settle_blas_kernels(argv)) return static_cast<ExitCode>(refused);
  if (cmd == "train") return train_main(args);
  if (cmd == "ckpt") return ckpt_command(args);
  if (cmd == "plan") return plan_command(args);
  if (cmd == "report") return report_command(args);
  if (cmd == "smoke") return smoke_command(args);
  if (cmd == "data") return data_command(args);
  if (cmd == "eval") return eval_main(args);
  if (cmd == "generate") return generate_command(args);
  if (cmd == "export") return export_command(args);
  std::fprintf(stderr, "pipetrain: error: unknown command '%s'\n%s", cmd.c_str(), kUsage);
  return ExitCode::bad_input;
}

}  // namespace

int main(int argc, char** argv) { return static_cast<int>(dispatch(argc, argv)); }
