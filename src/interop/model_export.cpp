#include "pipetrain/interop/model_export.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "pipetrain/ckpt/manifest.hpp"
#include "pipetrain/ckpt/resume.hpp"
#include "pipetrain/data/tokenizer.hpp"
#include "pipetrain/interop/gpt2_layout.hpp"
#include "pipetrain/interop/hf_family.hpp"
#include "pipetrain/interop/llmc_model.hpp"
#include "pipetrain/interop/safetensors.hpp"
#include "pipetrain/interop/weights_source.hpp"
#include "pipetrain/model/model.hpp"
#include "pipetrain/util/atomic_output.hpp"
#include "pipetrain/util/binary_file.hpp"
#include "pipetrain/util/files.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace pipetrain {
namespace {

json token_piece(const SpecialTokens::Token& t) { return t.id >= 0 ? json(t.piece) : json(nullptr); }

// tokenizer_config.json for the SentencePiece model beside it, as transformers' LlamaTokenizer
// (slow) and LlamaTokenizerFast (converted from it) read it: the model file, its special tokens,
// and no BOS or EOS added by the tokenizer, since pipetrain's token files hold the pieces alone.
std::string hf_tokenizer_config(const RunSpec& spec, const SpecialTokens& special) {
  const json c = {{"tokenizer_class", "LlamaTokenizer"},
                  {"vocab_file", kTokenizerFile},
                  {"unk_token", token_piece(special.unk)},
                  {"bos_token", token_piece(special.bos)},
                  {"eos_token", token_piece(special.eos)},
                  {"pad_token", token_piece(special.pad)},
                  {"add_bos_token", false},
                  {"add_eos_token", false},
                  {"legacy", false},
                  {"add_prefix_space", false},
                  {"clean_up_tokenization_spaces", false},
                  {"model_max_length", spec.model.seq_len}};
  return c.dump(2) + "\n";
}

void write_text_file(const std::string& path, const std::string& text) {
  BinaryWriter out(path);
  out.write(text.data(), text.size());
  out.close();
}

// Tensor `name` of `shape` stored as `parts`, each a run of its rows: the tensor is read at its first
// part and let go after its last.
void add_parts(std::vector<SafetensorsTensor>& tensors, const WeightsSource& ckpt, const std::string& name,
               const std::vector<int64_t>& shape, const std::vector<HfPart>& parts) {
  struct Whole {
    std::vector<float> values;
    size_t parts_left;
  };
  auto whole = std::make_shared<Whole>(Whole{{}, parts.size()});
  const int64_t cols = shape[1];
  for (const HfPart& part : parts)
    tensors.push_back({part.name, {part.rows, cols}, [&ckpt, name, shape, whole, part, cols](float* out) {
                         if (whole->values.empty()) {
                           whole->values.resize(static_cast<size_t>(shape[0] * cols));
                           ckpt.read(name, whole->values.data());
                         }
                         std::copy_n(whole->values.data() + part.first_row * cols, part.rows * cols, out);
                         if (--whole->parts_left == 0) std::vector<float>().swap(whole->values);
                       }});
}

void write_hf(const std::string& dir, const RunSpec& spec, const WeightsSource& ckpt, StoredFloat dtype,
              const std::string& checkpoint) {
  fs::create_directory(dir);
  std::vector<SafetensorsTensor> tensors;
  const HfFamily& family = hf_family(spec);
  for (const ParamTensor& p : stage_params(spec, 0, 1, 0, spec.model.n_layer)) {
    const std::string name = p.name;
    std::vector<int64_t> shape(p.shape.begin(), p.shape.end());
    const std::vector<HfPart> parts = family.parts(name, shape, spec.model.moe.experts);
    if (parts.size() > 1) {  // rows of it each (a Mixtral's experts): read once, while its parts are written
      add_parts(tensors, ckpt, name, shape, parts);
      continue;
    }
    const bool conv1d = family.transposed(name);
    if (conv1d) std::swap(shape[0], shape[1]);
    tensors.push_back({parts.front().name, shape, [&ckpt, name, conv1d, shape](float* out) {
                         if (!conv1d) return ckpt.read(name, out);
                         std::vector<float> linear(static_cast<size_t>(shape[0] * shape[1]));  // [out, in]
                         ckpt.read(name, linear.data());
                         transpose(linear.data(), shape[1], shape[0], out);
                       }});
  }
  BinaryWriter weights(dir + "/model.safetensors");
  write_safetensors(weights, tensors, dtype, {{"format", "pt"}});
  weights.close();
  // A model trained on SentencePiece tokens is unusable without its tokenizer: the one the
  // manifest lists (and `ckpt verify` checks), never a stray file of that name.
  const Manifest::Tokenizer& tokenizer = Manifest::read(checkpoint).tokenizer;
  const std::string model_file = checkpoint + "/" + tokenizer.file;
  const SpecialTokens special =
      tokenizer.file.empty()
          ? SpecialTokens{}
          : Tokenizer::sentencepiece(read_input_file(model_file, "tokenizer", 64 << 20), model_file).special_tokens();
  write_text_file(dir + "/config.json", family.config(spec, dtype, special).dump(2) + "\n");
  if (tokenizer.file.empty()) return;
  copy_file_synced(model_file, dir + "/" + kTokenizerFile);
  write_text_file(dir + "/tokenizer_config.json", hf_tokenizer_config(spec, special));
}

void write_llmc_file(const std::string& file, const RunSpec& spec, const WeightsSource& ckpt, StoredFloat dtype) {
  LlmcHeader h;
  h.max_seq_len = spec.model.seq_len;
  h.vocab = spec.model.vocab;
  h.n_layer = spec.model.n_layer;
  h.n_head = spec.model.n_head;
  h.channels = spec.model.d_model;
  h.padded_vocab = llmc_padded_vocab(spec.model.vocab);
  h.dtype = dtype;
  BinaryWriter out(file);
  write_llmc(out, h, [&](const std::string& name, float* values) { ckpt.read(name, values); });
  out.close();
}

// What an export to `format` may replace: a Hugging Face directory holding nothing but the files
// write_hf writes, or an llm.c model file.
bool is_export_of(ExportFormat format, const std::string& path) {
  if (format == ExportFormat::llmc) return LlmcFile::looks_like(path);
  return folder_holds_only(path, [](const std::string& name) {
    return name == "config.json" || name == "model.safetensors" || name == kTokenizerFile ||
           name == "tokenizer_config.json";
  });
}

}  // namespace

ExitCode run_export(const ModelExportOptions& opt) {
  if (opt.output.empty()) throw SpecError("export: which output? (--output PATH)");
  const StoredFloat dtype = opt.dtype == Dtype::bf16 ? StoredFloat::bf16 : StoredFloat::f32;
  const OutputRule rule{
      "export",
      "--output",
      opt.format == ExportFormat::hf
          ? "a Hugging Face export directory (config.json, model.safetensors, " + std::string(kTokenizerFile) + " only)"
          : "an llm.c model file",
      [&](const std::string& path) { return is_export_of(opt.format, path); },
      {opt.checkpoint},
      opt.force};
  check_output(opt.output, rule);
  const std::string checkpoint = resolve_checkpoint(opt.checkpoint, "export");
  const RunSpec spec = spec_of_checkpoint(checkpoint, {}, 1);
  if (opt.format == ExportFormat::hf)
    if (const std::string why = hf_family(spec).cannot_hold(spec); !why.empty())
      throw SpecError("export: " + checkpoint + ": " + why + " (a Hugging Face " + hf_family(spec).name +
                      " cannot hold this model; its export is not built yet)");
  if (!hf_family(spec.model.arch).llmc && opt.format == ExportFormat::llmc)
    throw SpecError("export: " + checkpoint + " is a model of the " + name_of(spec.model.arch) +
                    " family (model.arch): llm.c's model file holds GPT-2 only (use --format hf)");
  if (opt.format == ExportFormat::llmc && !spec.model.tie_embeddings)
    throw SpecError("export: " + checkpoint +
                    " has an untied head (model.tie_embeddings = false); llm.c's "
                    "model file always ties it to wte, so the head would be lost (use --format hf)");
  AtomicOutput output(opt.output, rule);
  const auto ckpt = WeightsSource::open(checkpoint);
  if (opt.format == ExportFormat::hf) write_hf(output.staging(), spec, *ckpt, dtype, checkpoint);
  else write_llmc_file(output.staging(), spec, *ckpt, dtype);
  output.commit();
  const std::string as = opt.format == ExportFormat::llmc
                             ? "an llm.c model file"
                             : "a Hugging Face " + std::string(hf_family(spec).name) + " directory";
  std::printf("exported %s (%s, %d blocks, d_model %d, vocab %d, %s head) to %s as %s, %s\n", checkpoint.c_str(),
              ckpt->kind().c_str(), spec.model.n_layer, spec.model.d_model, spec.model.vocab,
              spec.model.tie_embeddings ? "tied" : "untied", opt.output.c_str(), as.c_str(), dtype_name(dtype));
  return ExitCode::ok;
}

}  // namespace pipetrain
