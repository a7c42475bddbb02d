// pipetrain: subcommand dispatch only.
#include <boost/program_options.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "pipetrain/compute/blas_kernels.hpp"
#include "pipetrain/dist/world.hpp"
#include "pipetrain/config/spec.hpp"
#include "pipetrain/tools/ckpt_command.hpp"
#include "pipetrain/tools/generate.hpp"
#include "pipetrain/interop/model_export.hpp"
#include "pipetrain/tools/plan_command.hpp"
#include "pipetrain/tools/report.hpp"
#include "pipetrain/dist/signals.hpp"
#include "pipetrain/tools/smoke.hpp"
#include "pipetrain/util/atomic_output.hpp"
#include "pipetrain/util/files.hpp"
#include "pipetrain/data/corpus_formats.hpp"
#include "pipetrain/data/prepare.hpp"
#include "pipetrain/train/run_dir.hpp"
#include "pipetrain/train/train.hpp"
#include "pipetrain/util/version.hpp"

namespace po = boost::program_options;
using namespace pipetrain;

namespace {

const char* kUsage =
    "usage: pipetrain <command> [options]\n"
    "\n"
    "commands:\n"
    "  train   train a GPT over pp x dp MPI ranks with a pipeline schedule (launch with mpiexec / srun)\n"
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

// Parses a subcommand's arguments. Returns nothing to go on, else how the command ends: ok after
// --help, bad_input (with one message) for bad arguments.
std::optional<ExitCode> parse(const char* cmd, const po::options_description& desc, const std::vector<std::string>& args,
                              po::variables_map& vm, const po::positional_options_description& pos = {}) {
  try {
    po::store(po::command_line_parser(args).options(desc).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::fprintf(stderr, "pipetrain %s: error: %s (see pipetrain %s --help)\n", cmd, e.what(), cmd);
    return ExitCode::bad_input;
  }
  if (!vm.count("help")) return std::nullopt;
  std::cout << desc << "\n";
  return ExitCode::ok;
}

// Runs a command that needs no MPI: bad input (SpecError) and any other failure end it with one
// message and their code.
ExitCode run_offline(const std::function<ExitCode()>& body) {
  try {
    return body();
  } catch (const SpecError& e) {
    report_error(e.what());
    return ExitCode::bad_input;
  } catch (const std::exception& e) {
    report_fault(e.what());
    return ExitCode::fault;
  }
}

// Runs an MPI command: the world starts, the command runs, the world ends; a fault tears the job
// down instead of leaving peers waiting.
ExitCode run_mpi(const std::function<ExitCode(World&)>& body) {
  install_stop_handlers();  // before MPI_Init: a USR1/TERM during start-up must not kill the rank
  World world(nullptr, nullptr);
  ExitCode code = ExitCode::fault;
  try {
    code = body(world);
  } catch (const AgreedExit& e) {
    code = e.code;  // every rank agreed; the message was printed once
  } catch (const SpecError& e) {
    // Bad input found by one rank after start-up (an id beyond the token file's vocabulary, met
    // as its window is read): the others are mid-step, so the job ends here, as bad input.
    report_error(e.what());
    world.abort(ExitCode::bad_input);
  } catch (const CommTimeout& e) {
    report_fault(e.what());
    // The other ranks waiting on the same lost peer time out within moments of this one: give
    // them 2 s to say what they waited for before MPI_Abort tears them down.
    std::this_thread::sleep_for(std::chrono::seconds(2));
    world.abort(ExitCode::fault);
  } catch (const std::exception& e) {
    report_fault("rank " + std::to_string(world.rank()) + ": " + e.what());
    world.abort(ExitCode::fault);
  }
  world.finalize(code);
  return code;
}

ExitCode train_main(const std::vector<std::string>& args) {
  TrainOptions opt;
  std::string resume;
  po::options_description desc("pipetrain train [options]");
  desc.add_options()("help,h", "show this help")(
      "config", po::value<std::string>(&opt.config), "run spec (TOML); omitted: built-in defaults (tiny model)")(
      "set", po::value<std::vector<std::string>>(&opt.overrides)->composing(),
      "override one key: --set section.key=value (repeatable)")(
      "run-dir", po::value<std::string>(&opt.run_dir), "run directory (default: run.out_dir/run.name)")(
      "resume", po::value<std::string>(&resume)->default_value("auto"),
      "auto (newest intact checkpoint of the run dir, else fresh) | never | PATH (a checkpoint directory)")(
      "print-spec", "print the resolved spec (all keys and defaults) and exit")(
      "print-run-dir", "print the run directory (--run-dir, else run.out_dir/run.name) and exit; one process, no MPI")(
      "spec-reference", "print the run-spec key reference as a Markdown table and exit");
  po::variables_map vm;
  if (auto done = parse("train", desc, args, vm)) return *done;
  opt.resume = ResumeFrom::parse(resume);
  if (vm.count("spec-reference")) {
    std::cout << spec_reference_markdown();
    return ExitCode::ok;
  }
  if (vm.count("print-spec"))
    return run_offline([&] {
      std::cout << resolved_toml(load_spec(opt.config, opt.overrides, 0));
      return ExitCode::ok;
    });
  if (vm.count("print-run-dir"))
    return run_offline([&] {
      std::cout << resolve_run_dir(opt.run_dir, load_spec(opt.config, opt.overrides, 0)) << "\n";
      return ExitCode::ok;
    });
  return run_mpi([&](World& world) { return run_train(opt, world); });
}

ExitCode eval_main(const std::vector<std::string>& args) {
  TrainOptions opt;
  opt.eval_only = true;
  std::string checkpoint;  // a path: eval names its checkpoint (no auto, no never)
  po::options_description desc("pipetrain eval --checkpoint PATH [options]   (launch with mpiexec / srun)");
  desc.add_options()("help,h", "show this help")(
      "checkpoint", po::value<std::string>(&checkpoint),
      "a checkpoint (RUN_DIR/checkpoints/step_N), or a run directory, its checkpoints folder or latest file: the newest intact one")(
      "config", po::value<std::string>(&opt.config),
      "run spec (TOML); omitted: the checkpoint's own, laid out as pp 1 x dp ranks")(
      "set", po::value<std::vector<std::string>>(&opt.overrides)->composing(),
      "override one key, e.g. --set parallel.pp=2 (dp fills the ranks pp leaves; repeatable)")(
      "batches", po::value<int>(&opt.eval_batches), "validation batches (default eval.batches)");
  po::variables_map vm;
  if (auto done = parse("eval", desc, args, vm)) return *done;
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

ExitCode generate_main(const std::vector<std::string>& args) {
  GenerateOptions opt;
  po::options_description desc("pipetrain generate --checkpoint PATH --prompt TEXT [options]   (no MPI launch needed)");
  desc.add_options()("help,h", "show this help")(
      "checkpoint", po::value<std::string>(&opt.checkpoint),
      "a checkpoint (any saved layout), or a run directory, its checkpoints folder or latest file: the newest intact one")(
      "prompt", po::value<std::string>(&opt.prompt), "text to continue")(
      "tokens", po::value<int>(&opt.tokens)->default_value(200), "tokens to generate")(
      "temperature", po::value<double>(&opt.temperature)->default_value(1.0), "sampling temperature (0: greedy)")(
      "top-k", po::value<int>(&opt.top_k)->default_value(0), "sample among the k likeliest only (0: all)")(
      "seed", po::value<uint64_t>(&opt.seed)->default_value(0), "sampling seed: the same text for the same seed")(
      "no-cache", "recompute the whole window for every token (the KV cache's reference)")(
      "config", po::value<std::string>(&opt.config), "run spec (TOML); omitted: the checkpoint's own")(
      "set", po::value<std::vector<std::string>>(&opt.overrides)->composing(), "override one key (repeatable)");
  po::variables_map vm;
  if (auto done = parse("generate", desc, args, vm)) return *done;
  if (opt.checkpoint.empty()) {
    std::fprintf(stderr, "pipetrain generate: error: which checkpoint? (pipetrain generate --checkpoint PATH)\n");
    return ExitCode::bad_input;
  }
  opt.use_cache = vm.count("no-cache") == 0;
  return run_offline([&] { return run_generate(opt); });
}

ExitCode smoke_main(const std::vector<std::string>& args) {
  SmokeOptions opt;
  po::options_description desc("pipetrain smoke [options]   (launch like a job: srun --mpi=pmi2 / mpiexec)");
  desc.add_options()("help,h", "show this help")("config", po::value<std::string>(&opt.config), "run spec (TOML)")(
      "set", po::value<std::vector<std::string>>(&opt.overrides)->composing(), "override one key (repeatable)")(
      "run-dir", po::value<std::string>(&opt.run_dir), "where checkpoint I/O and training are tried (default run.out_dir/smoke)");
  po::variables_map vm;
  if (auto done = parse("smoke", desc, args, vm)) return *done;
  return run_mpi([&](World& world) { return run_smoke(opt, world); });
}

ExitCode plan_main(const std::vector<std::string>& args) {
  PlanOptions opt;
  double peak_tflops = 0, link_gbps = 0;
  po::options_description desc("pipetrain plan [options]   (no MPI launch needed)");
  desc.add_options()("help,h", "show this help")("config", po::value<std::string>(&opt.config), "run spec (TOML)")(
      "set", po::value<std::vector<std::string>>(&opt.overrides)->composing(), "override one key (repeatable)")(
      "world", po::value<int>(&opt.world), "rank count to plan for (checked against pp x dp; default pp x dp)")(
      "json", "print the prediction as JSON")(
      "compare-schedules", "one line per pipeline schedule for this layout: bubble and activation peak")(
      "ranks-per-node", po::value<int>(), "show the node map and the traffic crossing nodes when each node runs "
                                          "this many consecutive ranks")(
      "calibrate", "measure this machine's costs for the spec's model (kernels; messages when launched on 2+ "
                   "ranks) and write them to --output")(
      "from-run", po::value<std::string>(&opt.from_run), "with --calibrate: take the costs from a finished run's "
                                                          "trace (RUN_DIR, trained with log.trace_steps > 0) instead of measuring")(
      "output", po::value<std::string>(&opt.output)->default_value(opt.output), "where --calibrate writes its cost file")(
      "force", "--calibrate: replace an existing cost file")(
      "costs", po::value<std::string>(&opt.costs), "a cost file from --calibrate, or a finished run's directory (its "
                                                   "trace): predict the step time and the run's cost")(
      "peak-tflops", po::value<double>(&peak_tflops), "for a machine not at hand: each rank's peak TFLOP/s ...")(
      "link-gbps", po::value<double>(&link_gbps), "... and its link bandwidth in GB/s")(
      "efficiency", po::value<double>(&opt.efficiency), "... and the share of the peak the kernels reach (default 0.5)")(
      "memory-per-rank", po::value<std::string>(&opt.memory_per_rank), "each rank's device or node memory, e.g. "
                                                                       "141GiB: checked against the largest stage's need")(
      "auto", "pick the layout: every pp x dp = --world, micro-batches, schedule, chunks, recompute, partition and "
              "zero, within --memory-per-rank, ranked by the step time predicted with --costs (or the peak)");
  po::variables_map vm;
  if (auto done = parse("plan", desc, args, vm)) return *done;
  opt.json = vm.count("json") > 0;
  opt.compare_schedules = vm.count("compare-schedules") > 0;
  if (vm.count("ranks-per-node")) opt.ranks_per_node = vm["ranks-per-node"].as<int>();
  opt.automatic = vm.count("auto") > 0;
  if (vm.count("peak-tflops")) opt.peak_tflops = peak_tflops;
  if (vm.count("link-gbps")) opt.link_gbps = link_gbps;
  opt.calibrate = vm.count("calibrate") > 0;
  opt.output_given = !vm["output"].defaulted();
  opt.force = vm.count("force") > 0;
  if (opt.calibrate && !opt.from_run.empty()) return run_offline([&] { return run_calibrate_from_run(opt); });
  if (opt.calibrate) return run_mpi([&](World& world) { return run_calibrate(opt, world); });
  return run_offline([&] { return run_plan(opt); });
}

ExitCode report_main(const std::vector<std::string>& args) {
  std::string run_dir, plots;
  po::options_description desc("pipetrain report RUN_DIR [options]");
  desc.add_options()("help,h", "show this help")("run-dir", po::value<std::string>(&run_dir), "run directory")(
      "plots", po::value<std::string>(&plots), "also write PNG plots there (needs /usr/bin/python3 + matplotlib)")(
      "json", "print the figures as one JSON document instead of text (for scripts)");
  po::positional_options_description pos;
  pos.add("run-dir", 1);
  po::variables_map vm;
  if (auto done = parse("report", desc, args, vm, pos)) return *done;
  if (run_dir.empty()) {
    std::fprintf(stderr, "pipetrain report: error: which run directory? (pipetrain report RUN_DIR)\n");
    return ExitCode::bad_input;
  }
  return run_offline([&] { return run_report(run_dir, plots, vm.count("json") > 0); });
}

ExitCode data_prepare(const std::vector<std::string>& args) {
  PrepareOptions opt;
  std::string tokenizer;
  po::options_description desc("pipetrain data prepare --input FILE... --output DATA.h5 [options]   (no MPI)");
  desc.add_options()("help,h", "show this help")(
      "input", po::value<std::vector<std::string>>(&opt.inputs)->multitoken()->composing(),
      "text files, concatenated in order")("output", po::value<std::string>(&opt.output),
                                             "the token file to write (HDF5: /train, /val)")(
      "val-fraction", po::value<double>(&opt.val_fraction)->default_value(0.1, "0.1"),
      "share of each input's tokens, from its end, held out as /val")(
      "tokenizer", po::value<std::string>(&tokenizer)->default_value("bytes"), "bytes | sentencepiece")(
      "vocab-size", po::value<int>(&opt.vocab_size), "sentencepiece: pieces to train (byte fallback on)")(
      "model-type", po::value<std::string>(&opt.model_type)->default_value("bpe"), "sentencepiece: bpe | unigram")(
      "tokenizer-model", po::value<std::string>(&opt.tokenizer_model), "sentencepiece: use this .model instead of training one")(
      "sample-mb", po::value<double>(&opt.sample_mb)->default_value(64), "sentencepiece: train on about this many MiB of the text")(
      "compress", "gzip the token datasets")("force", "replace an existing output file");
  po::variables_map vm;
  if (auto done = parse("data prepare", desc, args, vm)) return *done;
  opt.compress = vm.count("compress") > 0;
  opt.force = vm.count("force") > 0;
  return run_offline([&] {
    opt.tokenizer =
        parse_choice("data prepare: --tokenizer", tokenizer, {TokenizerKind::bytes, TokenizerKind::sentencepiece});
    std::printf("%s\n", prepare_token_file(opt).c_str());
    return ExitCode::ok;
  });
}

ExitCode data_import(const std::vector<std::string>& args) {
  TokenImportOptions opt;
  std::string format;
  po::options_description desc("pipetrain data import --format llmc|nanogpt|megatron INPUT... --output DATA.h5 [options]");
  desc.add_options()("help,h", "show this help")(
      "format", po::value<std::string>(&format), "llmc (llm.c shards) | nanogpt (headerless) | megatron (PREFIX of .idx/.bin)")(
      "input", po::value<std::vector<std::string>>(&opt.inputs)->multitoken()->composing(), "the training inputs, in order")(
      "output", po::value<std::string>(&opt.output), "the token file to write")(
      "vocab-size", po::value<int64_t>(&opt.vocab_size), "ids must be below this (default: the largest id + 1)")(
      "val-fraction", po::value<double>(&opt.val_fraction)->default_value(0.1, "0.1"),
      "share of the tokens, from the end, held out as /val (without --val)")(
      "val", po::value<std::vector<std::string>>(&opt.val)->multitoken()->composing(), "held-out inputs for /val")(
      "dtype", po::value<std::string>(&opt.dtype)->default_value("uint16"), "nanogpt: uint8 | uint16 | uint32")(
      "compress", "gzip the token datasets")("force", "replace an existing output file");
  po::positional_options_description pos;
  pos.add("input", -1);
  po::variables_map vm;
  if (auto done = parse("data import", desc, args, vm, pos)) return *done;
  opt.compress = vm.count("compress") > 0;
  opt.force = vm.count("force") > 0;
  if (vm.count("val") && !vm["val-fraction"].defaulted()) {
    std::fprintf(stderr, "pipetrain data import: error: --val and --val-fraction both say what /val is: give one\n");
    return ExitCode::bad_input;
  }
  return run_offline([&] {
    opt.format = parse_choice("data import: --format", format,
                              {CorpusFormat::llmc, CorpusFormat::nanogpt, CorpusFormat::megatron});
    std::printf("%s\n", import_tokens(opt).c_str());
    return ExitCode::ok;
  });
}

ExitCode data_export(const std::vector<std::string>& args) {
  TokenExportOptions opt;
  std::string split = "train", format;
  po::options_description desc("pipetrain data export DATA.h5 --format llmc|megatron --output OUT [options]");
  desc.add_options()("help,h", "show this help")("input", po::value<std::string>(&opt.input), "the token file")(
      "format", po::value<std::string>(&format), "llmc (a shard file OUT) | megatron (OUT.idx + OUT.bin)")(
      "output", po::value<std::string>(&opt.output), "the file (llmc) or prefix (megatron) to write")(
      "split", po::value<std::string>(&split)->default_value("train"), "train | val")("force", "replace existing output");
  po::positional_options_description pos;
  pos.add("input", 1);
  po::variables_map vm;
  if (auto done = parse("data export", desc, args, vm, pos)) return *done;
  opt.force = vm.count("force") > 0;
  opt.val = split == "val";
  if (opt.input.empty() || (split != "train" && split != "val")) {
    std::fprintf(stderr, "pipetrain data export: error: %s\n",
                 opt.input.empty() ? "which token file? (pipetrain data export DATA.h5 ...)" : ("--split " + split + " (train or val)").c_str());
    return ExitCode::bad_input;
  }
  return run_offline([&] {
    opt.format = parse_choice("data export: --format", format, {CorpusFormat::llmc, CorpusFormat::megatron});
    std::printf("%s\n", export_tokens(opt).c_str());
    return ExitCode::ok;
  });
}

ExitCode data_inspect(const std::vector<std::string>& args) {
  std::string path;
  int sample = 64;
  po::options_description desc("pipetrain data inspect DATA.h5 [--sample N]");
  desc.add_options()("help,h", "show this help")("input", po::value<std::string>(&path), "the token file")(
      "sample", po::value<int>(&sample)->default_value(64), "tokens of /train to show decoded");
  po::positional_options_description pos;
  pos.add("input", 1);
  po::variables_map vm;
  if (auto done = parse("data inspect", desc, args, vm, pos)) return *done;
  if (path.empty()) {
    std::fprintf(stderr, "pipetrain data inspect: error: which token file? (pipetrain data inspect DATA.h5)\n");
    return ExitCode::bad_input;
  }
  return run_offline([&] {
    std::fputs(inspect_token_file(path, sample).c_str(), stdout);
    return ExitCode::ok;
  });
}

ExitCode data_main(const std::vector<std::string>& args) {
  const char* usage =
      "usage: pipetrain data prepare --input FILE... --output DATA.h5 [--tokenizer bytes|sentencepiece ...]\n"
      "       pipetrain data import --format llmc|nanogpt|megatron INPUT... --output DATA.h5 [--val INPUT...]\n"
      "       pipetrain data export DATA.h5 --format llmc|megatron --output OUT [--split train|val]\n"
      "       pipetrain data inspect DATA.h5\n";
  const std::string sub = args.empty() ? "" : args[0];
  const std::vector<std::string> rest(args.begin() + (args.empty() ? 0 : 1), args.end());
  if (sub == "prepare") return data_prepare(rest);
  if (sub == "import") return data_import(rest);
  if (sub == "export") return data_export(rest);
  if (sub == "inspect") return data_inspect(rest);
  const bool help = sub == "--help" || sub == "-h";
  std::fputs(usage, help ? stdout : stderr);
  return help ? ExitCode::ok : ExitCode::bad_input;
}

ExitCode export_main(const std::vector<std::string>& args) {
  ModelExportOptions opt;
  std::string format, dtype;
  po::options_description desc("pipetrain export --checkpoint PATH --format hf|llmc --output OUT [options]   (no MPI)");
  desc.add_options()("help,h", "show this help")(
      "checkpoint", po::value<std::string>(&opt.checkpoint),
      "a checkpoint (any saved layout), or a run directory, its checkpoints folder or latest file: the newest intact one")(
      "format", po::value<std::string>(&format),
      "hf (a Hugging Face GPT-2 directory: config.json, model.safetensors) | llmc (llm.c's model file)")(
      "output", po::value<std::string>(&opt.output), "the directory (hf) or file (llmc) to write")(
      "dtype", po::value<std::string>(&dtype)->default_value("fp32"), "fp32 | bf16 (rounded to nearest even)")(
      "force", "replace an existing output");
  po::variables_map vm;
  if (auto done = parse("export", desc, args, vm)) return *done;
  if (opt.checkpoint.empty() || format.empty()) {
    std::fprintf(stderr, "pipetrain export: error: %s (pipetrain export --checkpoint PATH --format hf|llmc --output OUT)\n",
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

ExitCode ckpt_main(const std::vector<std::string>& args) {
  const bool help = std::any_of(args.begin(), args.end(), [](const std::string& a) { return a == "--help" || a == "-h"; });
  if (help || args.size() != 2 || (args[0] != "inspect" && args[0] != "verify")) {
    std::fputs("usage: pipetrain ckpt inspect|verify PATH\n"
               "  PATH: a checkpoint (RUN_DIR/checkpoints/step_00000100), or a run directory, its checkpoints folder\n"
               "  or its latest file: inspect shows the newest checkpoint there; verify checks the newest intact one\n"
               "  and the one latest names (exit 2 when latest names a missing or damaged checkpoint)\n",
               help ? stdout : stderr);
    return help ? ExitCode::ok : ExitCode::bad_input;
  }
  return run_offline([&] { return args[0] == "inspect" ? ckpt_inspect(args[1]) : ckpt_verify(args[1]); });
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
  for (const char* computes : {"train", "eval", "generate", "smoke", "plan"})
    if (cmd == computes)
      if (int refused = settle_blas_kernels(argv)) return static_cast<ExitCode>(refused);
  if (cmd == "train") return train_main(args);
  if (cmd == "ckpt") return ckpt_main(args);
  if (cmd == "plan") return plan_main(args);
  if (cmd == "report") return report_main(args);
  if (cmd == "smoke") return smoke_main(args);
  if (cmd == "data") return data_main(args);
  if (cmd == "eval") return eval_main(args);
  if (cmd == "generate") return generate_main(args);
  if (cmd == "export") return export_main(args);
  std::fprintf(stderr, "pipetrain: error: unknown command '%s'\n%s", cmd.c_str(), kUsage);
  return ExitCode::bad_input;
}

}  // namespace

int main(int argc, char** argv) { return static_cast<int>(dispatch(argc, argv)); }
