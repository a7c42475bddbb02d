// `pipetrain data prepare | import | export | inspect`: their command lines; the work is the data
// layer's (data/prepare, data/corpus_formats).
#include "pipetrain/tools/data_command.hpp"

#include <cstdio>

#include "pipetrain/data/corpus_formats.hpp"
#include "pipetrain/data/prepare.hpp"
#include "pipetrain/tools/cli.hpp"

namespace pipetrain {
namespace {

ExitCode data_prepare(const std::vector<std::string>& args) {
  PrepareOptions opt;
  std::string tokenizer, documents;
  po::options_description desc("pipetrain data prepare --input FILE... --output DATA.h5 [options]   (no MPI)");
  desc.add_options()("help,h", "show this help")(
      "input", po::value<std::vector<std::string>>(&opt.inputs)->multitoken()->composing(),
      "text files (.gz read as they decompress; .jsonl: each line's \"text\" one document), globs or folders, "
      "concatenated in order")("output", po::value<std::string>(&opt.output),
                               "the token file to write (HDF5: /train, /val)")(
      "val-fraction", po::value<double>(&opt.val_fraction)->default_value(0.1, "0.1"),
      "share of each input's tokens, from its end, held out as /val")(
      "tokenizer", po::value<std::string>(&tokenizer)->default_value("bytes"), "bytes | sentencepiece")(
      "vocab-size", po::value<int>(&opt.vocab_size), "sentencepiece: pieces to train (byte fallback on)")(
      "model-type", po::value<std::string>(&opt.model_type)->default_value("bpe"), "sentencepiece: bpe | unigram")(
      "tokenizer-model", po::value<std::string>(&opt.tokenizer_model),
      "sentencepiece: use this .model instead of training one (or a Hugging Face model directory's "
      "tokenizer.model: give the directory)")("sample-mb", po::value<double>(&opt.sample_mb)->default_value(64),
                                              "sentencepiece: train on about this many MiB of the text")(
      "documents", po::value<std::string>(&documents)->default_value("none"),
      "where plain text's documents end, each then followed by the end-of-document token (SentencePiece's </s>; "
      "256 for bytes, vocabulary 257): none | file (each input) | paragraph (also after each blank line); a .jsonl "
      "record always ends one")("threads", po::value<unsigned>(&opt.threads)->default_value(0),
                                "encoding threads (0: the cores, at most 8)")(
      "shard-mb", po::value<double>(&opt.shard_mb)->default_value(0),
      "write shards of about this many MB of tokens, OUTPUT's stem + _00000.h5, ... (each its part of /train and "
      "/val; a data.sources glob reads them): 0, one file")("compress", "gzip the token datasets")(
      "force", "replace an existing output file");
  po::variables_map vm;
  if (auto done = parse_command_line("data prepare", desc, args, vm)) return *done;
  opt.compress = vm.count("compress") > 0;
  opt.force = vm.count("force") > 0;
  return run_offline([&] {
    opt.tokenizer =
        parse_choice("data prepare: --tokenizer", tokenizer, {TokenizerKind::bytes, TokenizerKind::sentencepiece});
    opt.documents = parse_choice("data prepare: --documents", documents,
                                 {DocumentSplit::none, DocumentSplit::file, DocumentSplit::paragraph});
    std::printf("%s\n", prepare_token_file(opt).c_str());
    return ExitCode::ok;
  });
}

ExitCode data_import(const std::vector<std::string>& args) {
  TokenImportOptions opt;
  std::string format;
  po::options_description desc(
      "pipetrain data import --format llmc|nanogpt|megatron INPUT... --output DATA.h5 [options]");
  desc.add_options()("help,h", "show this help")(
      "format", po::value<std::string>(&format),
      "llmc (llm.c shards) | nanogpt (headerless) | megatron (PREFIX of .idx/.bin)")(
      "input", po::value<std::vector<std::string>>(&opt.inputs)->multitoken()->composing(),
      "the training inputs, in order")("output", po::value<std::string>(&opt.output), "the token file to write")(
      "vocab-size", po::value<int64_t>(&opt.vocab_size), "ids must be below this (default: the largest id + 1)")(
      "val-fraction", po::value<double>(&opt.val_fraction)->default_value(0.1, "0.1"),
      "share of the tokens, from the end, held out as /val (without --val)")(
      "val", po::value<std::vector<std::string>>(&opt.val)->multitoken()->composing(), "held-out inputs for /val")(
      "dtype", po::value<std::string>(&opt.dtype)->default_value("uint16"), "nanogpt: uint8 | uint16 | uint32")(
      "document-token", po::value<int64_t>(&opt.document_token)->default_value(-1),
      "the token that separates the corpus's documents (GPT-2's <|endoftext|> is 50256, as llm.c's and nanoGPT's "
      "GPT-2 data put it between documents): recorded with each document's start, for data.document_mask")(
      "compress", "gzip the token datasets")("force", "replace an existing output file");
  po::positional_options_description pos;
  pos.add("input", -1);
  po::variables_map vm;
  if (auto done = parse_command_line("data import", desc, args, vm, pos)) return *done;
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
      "split", po::value<std::string>(&split)->default_value("train"), "train | val")("force",
                                                                                      "replace existing output");
  po::positional_options_description pos;
  pos.add("input", 1);
  po::variables_map vm;
  if (auto done = parse_command_line("data export", desc, args, vm, pos)) return *done;
  opt.force = vm.count("force") > 0;
  opt.val = split == "val";
  if (opt.input.empty() || (split != "train" && split != "val")) {
    std::fprintf(stderr, "pipetrain data export: error: %s\n",
                 opt.input.empty() ? "which token file? (pipetrain data export DATA.h5 ...)"
                                   : ("--split " + split + " (train or val)").c_str());
    return ExitCode::bad_input;
  }
  return run_offline([&] {
    opt.format = parse_choice("data export: --format", format, {CorpusFormat::llmc, CorpusFormat::megatron});
    std::printf("%s\n", export_tokens(opt).c_str());
    return ExitCode::ok;
  });
}

ExitCode data_inspect(const std::vector<std::string>& args) {
  std::string path, config;
  std::vector<std::string> sets;
  int sample = 64;
  po::options_description desc(
      "pipetrain data inspect DATA.h5 [--sample N] [--json]\n"
      "pipetrain data inspect [--config FILE] [--set KEY=VALUE ...] [--json]   (a run spec's data: its mixture)");
  desc.add_options()("help,h", "show this help")("input", po::value<std::string>(&path), "the token file")(
      "sample", po::value<int>(&sample)->default_value(64), "tokens of /train to show decoded")(
      "config", po::value<std::string>(&config), "a run spec whose data to open as training would")(
      "set", po::value<std::vector<std::string>>(&sets)->composing(), "override one key of it (repeatable)")(
      "json", "print the same facts as one JSON object (for scripts)");
  po::positional_options_description pos;
  pos.add("input", 1);
  po::variables_map vm;
  if (auto done = parse_command_line("data inspect", desc, args, vm, pos)) return *done;
  if (path.empty() && config.empty() && sets.empty()) {
    std::fprintf(stderr,
                 "pipetrain data inspect: error: which data? (pipetrain data inspect DATA.h5, or --config RUN.toml "
                 "for a run's)\n");
    return ExitCode::bad_input;
  }
  return run_offline([&] {
    const bool json = vm.count("json") > 0;
    std::fputs(
        (path.empty() ? inspect_run_data(load_spec(config, sets, 1), json) : inspect_token_file(path, sample, json))
            .c_str(),
        stdout);
    return ExitCode::ok;
  });
}

}  // namespace

ExitCode data_command(const std::vector<std::string>& args) {
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

}  // namespace pipetrain
