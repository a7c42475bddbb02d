#include "pipetrain/tools/generate.hpp"
#include "pipetrain/tools/cli.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "pipetrain/ckpt/manifest.hpp"
#include "pipetrain/ckpt/resume.hpp"
#include "pipetrain/compute/kernels.hpp"
#include "pipetrain/config/spec.hpp"
#include "pipetrain/data/tokenizer.hpp"
#include "pipetrain/model/model.hpp"
#include "pipetrain/util/clock.hpp"
#include "pipetrain/util/files.hpp"
#include "pipetrain/util/rng.hpp"

namespace pipetrain {
namespace {

// The next-token distribution of tokens[from, end) by the training forward, recomputing them all:
// the window padded to seq_len (causal attention: the padding cannot reach earlier positions).
void recompute(Stage& stage, const RunSpec& spec, const std::vector<int>& tokens, size_t from, float* probs) {
  const int T = spec.model.seq_len, V = spec.model.vocab, n = static_cast<int>(tokens.size() - from);
  std::vector<int> window(T, 0), targets(T, 0);
  std::copy(tokens.begin() + from, tokens.end(), window.begin());
  stage.set_tokens(0, window.data());
  stage.set_targets(0, targets.data());
  stage.set_documents(0, window.data());
  stage.forward(0, 0, nullptr);
  const float* all = stage.head_probs(0).data();
  std::copy(all + static_cast<size_t>(n - 1) * V, all + static_cast<size_t>(n) * V, probs);
  stage.discard(0, 0);
}

// The checkpoint's SentencePiece model when it carries one, else byte tokens.
Tokenizer tokenizer_of(const std::string& checkpoint) {
  const Manifest m = Manifest::read(checkpoint);
  if (m.tokenizer.file.empty()) return Tokenizer();
  const std::string path = checkpoint + "/" + m.tokenizer.file;
  Tokenizer tok =
      Tokenizer::sentencepiece(read_input_file(path, "generate: the checkpoint's tokenizer", 1 << 30), path);
  if (!tok.normalisation().empty())
    std::fprintf(stderr, "generate: the checkpoint's tokenizer normalises its text: %s\n", tok.normalisation().c_str());
  return tok;
}

// Prints generated tokens as they come, decoded from all tokens so far (a SentencePiece piece's
// text can depend on its neighbours) with the new part printed. It is held back while the text
// ends in a partial character (U+FFFD) that the next byte tokens may complete. Byte tokens go out
// as bytes; an id the tokenizer lacks as <id>.
class TextOut {
 public:
  explicit TextOut(const Tokenizer& tok) : tok_(tok) {}
  void add(int id) {
    ids_.push_back(id);
    flush(false);
  }
  void finish() {
    flush(true);
    std::fputc('\n', stdout);
  }

 private:
  void flush(bool last) {
    const std::string text = tok_.decode(ids_);
    static const std::string partial = "\xEF\xBF\xBD";
    if (!tok_.is_bytes() && !last && text.size() >= 3 && text.compare(text.size() - 3, 3, partial) == 0) return;
    // Normally the text grows at its end; should decoding change what was printed, print from
    // where it differs rather than lose text.
    size_t same = 0;
    while (same < std::min(text.size(), printed_.size()) && text[same] == printed_[same]) ++same;
    std::fwrite(text.data() + same, 1, text.size() - same, stdout);
    std::fflush(stdout);
    printed_ = text;
  }
  const Tokenizer& tok_;
  std::vector<int> ids_;
  std::string printed_;
};

}  // namespace

int sample_token(const float* probs, int V, double temperature, int top_k, double u) {
  if (temperature <= 0) return static_cast<int>(std::max_element(probs, probs + V) - probs);
  // p^(1/T) relative to the likeliest token: no underflow to all zeros at small T
  const double top = std::log(std::max(*std::max_element(probs, probs + V), 1e-38f));
  std::vector<double> w(V);
  for (int i = 0; i < V; ++i)
    w[i] = probs[i] > 0 ? std::exp((std::log(static_cast<double>(probs[i])) - top) / temperature) : 0.0;
  if (top_k > 0 && top_k < V) {
    std::vector<int> order(V);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return w[a] > w[b]; });
    for (int r = top_k; r < V; ++r) w[order[r]] = 0;
  }
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  double acc = 0;
  int last = 0;
  for (int i = 0; i < V; ++i) {
    if (w[i] <= 0) continue;
    last = i;
    if ((acc += w[i] / total) > u) return i;
  }
  return last;  // u within rounding of 1
}

ExitCode run_generate(const GenerateOptions& opt) {
  if (opt.prompt.empty()) throw SpecError("generate: --prompt is empty (give at least one character to start from)");
  if (opt.tokens <= 0) throw SpecError("generate: --tokens " + std::to_string(opt.tokens) + " must be at least 1");
  // One stage holding every block, one micro-batch of one sequence.
  // The user's overrides first, then what generation needs, which they cannot undo.
  std::vector<std::string> sets = opt.overrides;
  for (auto& s :
       {"train.global_batch=1", "parallel.micro_batches=1", "parallel.recompute=none", "eval.every_steps=0",
        "run.device=cpu", "model.dtype=fp32", "parallel.tp=1", "parallel.sequence_parallel=false", "parallel.pp=1",
        "parallel.dp=1", "parallel.partition=uniform", "parallel.schedule=gpipe", "parallel.virtual_stages=1"})
    sets.push_back(s);
  const std::string checkpoint = resolve_checkpoint(opt.checkpoint, "generate");
  const RunSpec spec = opt.config.empty() ? spec_of_checkpoint(checkpoint, sets, 1) : load_spec(opt.config, sets, 1);
  const int V = spec.model.vocab, T = spec.model.seq_len;
  const Tokenizer tok = tokenizer_of(checkpoint);
  std::vector<uint32_t> prompt_ids;
  tok.encode(opt.prompt, &prompt_ids);
  std::vector<int> tokens(prompt_ids.begin(), prompt_ids.end());
  for (int t : tokens)
    if (t >= V)
      throw SpecError("generate: the prompt has token " + std::to_string(t) + " (" + tok.name() +
                      "), beyond model.vocab = " + std::to_string(V));
  Stage stage(spec, 0, 1, 0, spec.model.n_layer, 1, 1.f);
  read_checkpoint_tensors(checkpoint, stage.params(), stage.weights().host().data(), nullptr, nullptr, nullptr);
  if (spec.data.document_mask) {  // a run trained within documents generates within them too
    const int separator = spec.data.document_token >= 0 ? spec.data.document_token : tok.special_tokens().eos.id;
    if (separator < 0)
      throw SpecError("generate: the run masks documents (data.document_mask) but the checkpoint's tokenizer (" +
                      std::string(tok.name()) + ") has no end-of-document token: --set data.document_token=N");
    stage.set_document_mask({separator, spec.data.restart_positions});
  }
  KvCache cache;  // the window's keys and values so far

  SplitMix64 rng{opt.seed * 0x9e3779b97f4a7c15ULL + 1};
  std::vector<float> probs(V), all_probs;
  size_t from = 0;  // the window's first token
  std::fwrite(opt.prompt.data(), 1, opt.prompt.size(), stdout);
  TextOut out(tok);
  const double t0 = now_s();
  for (int i = 0; i < opt.tokens; ++i) {
    if (tokens.size() - from > static_cast<size_t>(T)) {  // slide: keep the last T / 2
      from = tokens.size() - std::max(1, T / 2);
      cache.pos = cache.document = 0;
    }
    if (opt.use_cache) {  // the tokens the cache has not seen yet (the prompt at first, then one)
      const size_t seen = from + cache.pos;
      const int n = static_cast<int>(tokens.size() - seen);
      all_probs.resize(static_cast<size_t>(n) * V);
      stage.forward_cached(tokens.data() + seen, n, cache, all_probs.data());
      std::copy(all_probs.end() - V, all_probs.end(), probs.begin());
    } else {
      recompute(stage, spec, tokens, from, probs.data());
    }
    const int next = sample_token(probs.data(), V, opt.temperature, opt.top_k, rng.uniform());
    tokens.push_back(next);
    out.add(next);
  }
  out.finish();
  const double secs = now_s() - t0;
  std::fprintf(stderr, "generated %d tokens in %.2f s (%.0f tokens/s, %s)\n", opt.tokens, secs, opt.tokens / secs,
               opt.use_cache ? "KV cache" : "recomputing the window");
  return ExitCode::ok;
}

ExitCode generate_command(const std::vector<std::string>& args) {
  GenerateOptions opt;
  po::options_description desc("pipetrain generate --checkpoint PATH --prompt TEXT [options]   (no MPI launch needed)");
  desc.add_options()("help,h", "show this help")("checkpoint", po::value<std::string>(&opt.checkpoint),
                                                 "a checkpoint (any saved layout), or a run directory, its checkpoints "
                                                 "folder or latest file: the newest intact one")(
      "prompt", po::value<std::string>(&opt.prompt), "text to continue")(
      "tokens", po::value<int>(&opt.tokens)->default_value(200), "tokens to generate")(
      "temperature", po::value<double>(&opt.temperature)->default_value(1.0), "sampling temperature (0: greedy)")(
      "top-k", po::value<int>(&opt.top_k)->default_value(0), "sample among the k likeliest only (0: all)")(
      "seed", po::value<uint64_t>(&opt.seed)->default_value(0), "sampling seed: the same text for the same seed")(
      "no-cache", "recompute the whole window for every token (the KV cache's reference)")(
      "config", po::value<std::string>(&opt.config), "run spec (TOML); omitted: the checkpoint's own")(
      "set", po::value<std::vector<std::string>>(&opt.overrides)->composing(), "override one key (repeatable)");
  po::variables_map vm;
  if (auto done = parse_command_line("generate", desc, args, vm)) return *done;
  if (opt.checkpoint.empty()) {
    std::fprintf(stderr, "pipetrain generate: error: which checkpoint? (pipetrain generate --checkpoint PATH)\n");
    return ExitCode::bad_input;
  }
  opt.use_cache = vm.count("no-cache") == 0;
  return run_offline([&] { return run_generate(opt); });
}

}  // namespace pipetrain
