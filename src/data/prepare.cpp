#include "pipetrain/data/prepare.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iomanip>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "pipetrain/data/corpus_index.hpp"
#include "pipetrain/data/mixture.hpp"
#include "pipetrain/data/token_file.hpp"
#include "pipetrain/data/tokenizer.hpp"
#include "pipetrain/util/binary_file.hpp"
#include "pipetrain/util/clock.hpp"
#include "pipetrain/util/errors.hpp"
#include "pipetrain/util/files.hpp"

namespace fs = std::filesystem;

namespace pipetrain {
namespace {

constexpr size_t kBlock = 8 << 20;  // bytes of tokens copied at a time
// Bytes of text one thread encodes at a time: small enough that a few MB of input keep every
// thread busy, large enough that a batch's start and its spool write are a small part of it.
constexpr size_t kTextBlock = 1 << 20;
using File = std::unique_ptr<FILE, int (*)(FILE*)>;

File open_input(const std::string& path, const char* mode = "rb") {
  File f(std::fopen(path.c_str(), mode), std::fclose);
  if (!f) throw SpecError("data prepare: " + path + ": " + std::strerror(errno));
  return f;
}

// A progress line on stderr every 1/20 of a large job (at least 64 MiB apart): how far, how fast,
// and how long the rest will take at that rate.
class Progress {
 public:
  Progress(const char* what, uint64_t total)
      : what_(what), total_(total), every_(std::max<uint64_t>(64ull << 20, total / 20)), next_(every_) {}
  void add(uint64_t n) {
    done_ += n;
    if (total_ > (64ull << 20) && done_ >= next_) {
      const double seconds = std::max(1e-3, now_s() - start_), rate = static_cast<double>(done_) / seconds;
      std::fprintf(stderr, "data prepare: %s of %s %s (%.0f%%), %s/s, %.0f s to go\n",
                   human_bytes(static_cast<double>(done_)).c_str(), human_bytes(static_cast<double>(total_)).c_str(),
                   what_, 100.0 * static_cast<double>(done_) / static_cast<double>(total_), human_bytes(rate).c_str(),
                   static_cast<double>(total_ > done_ ? total_ - done_ : 0) / rate);
      while (next_ <= done_) next_ += every_;
    }
  }

 private:
  const char* what_;
  uint64_t total_, every_, next_, done_ = 0;
  double start_ = now_s();
};

// A run of stored tokens to copy into the token file: an input's bytes (width 1) or its ids in
// the SentencePiece spool (width 4).
struct TokenRun {
  std::string path;     // the file holding them
  uint64_t offset = 0;  // byte offset of the first
  uint64_t count = 0;
  int width = 1;
  std::string source;  // for messages: the input they came from
};

// Appends tokens [from, from + n) of a run, block by block.
void append_range(const TokenRun& run, uint64_t from, uint64_t n, TokenFileWriter& out, Progress& progress) {
  const BinaryReader in(run.path);
  std::vector<uint8_t> raw;
  std::vector<uint32_t> ids;
  for (uint64_t done = 0; done < n;) {
    const size_t k = static_cast<size_t>(std::min<uint64_t>(kBlock / 4, n - done));
    raw.resize(k * run.width);
    ids.resize(k);
    if (!in.read_at(run.offset + (from + done) * run.width, raw.data(), raw.size()))
      throw SpecError("data prepare: " + run.source + ": shorter than when it was counted (changed while read?)");
    widen_ids(raw.data(), k, run.width, ids.data());
    out.append(ids.data(), k, run.source, from + done);
    progress.add(k * run.width);
    done += k;
  }
}

// Where a run's tokens before `cut` end their last whole document: after the last `separator`
// before it, or `cut` itself when the run has none there.
uint64_t document_cut(const TokenRun& run, uint64_t cut, int separator) {
  const BinaryReader in(run.path);
  std::vector<uint32_t> ids;
  for (uint64_t end = cut; end > 0;) {
    const uint64_t from = end - std::min<uint64_t>(end, kBlock / 4);
    ids.resize(static_cast<size_t>(end - from));
    if (!in.read_at(run.offset + from * 4, ids.data(), ids.size() * 4))
      throw SpecError("data prepare: " + run.source + ": its tokens could not be read back");
    for (size_t i = ids.size(); i-- > 0;)
      if (ids[i] == static_cast<uint32_t>(separator)) return from + i + 1;
    end = from;
  }
  return cut;
}

// The inputs encoded into a spool of 32-bit ids next to the output, since the token count is known
// only at the end: read in blocks cut at line ends (TextInput), a batch of blocks encoded at once,
// one thread per block, each document followed by `separator` (>= 0 where documents are kept).
// Returns each input's run of ids in the spool.
std::vector<TokenRun> encode_to_spool(const PrepareOptions& opt, const Tokenizer& tok, int separator,
                                      const std::string& spool_path, uint64_t total) {
  std::error_code ec;
  if (fs::path(opt.output).has_parent_path()) fs::create_directories(fs::path(opt.output).parent_path(), ec);
  File spool_file = open_input(spool_path, "wb");
  FILE* spool = spool_file.get();
  // At most 8 blocks in flight: their text and ids (4 bytes per token) stay a few hundred MiB.
  const unsigned threads = opt.threads ? opt.threads : std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
  Progress progress("encoded", total);
  uint64_t count = 0;
  std::vector<TokenRun> runs;
  for (const auto& in : opt.inputs) {
    runs.push_back({spool_path, count * sizeof(uint32_t), 0, 4, in});
    TextInput input(in, opt.documents);
    bool more = true;
    while (more) {
      std::vector<TextBlock> blocks(threads);
      size_t n = 0;
      const uint64_t before = input.bytes_read();
      while (n < threads && (more = input.next(blocks[n], kTextBlock))) ++n;
      progress.add(input.bytes_read() - before);
      std::vector<std::vector<uint32_t>> ids(n);
      std::vector<std::exception_ptr> failed(n);
      std::vector<std::thread> workers;
      for (size_t i = 0; i < n; ++i)
        workers.emplace_back([&, i] {
          try {
            const TextBlock& b = blocks[i];
            size_t from = 0;
            for (size_t end : b.ends) {  // each document's text, then its end
              tok.encode(b.text.substr(from, end - from), &ids[i]);
              ids[i].push_back(static_cast<uint32_t>(separator));
              from = end;
            }
            if (from < b.text.size()) tok.encode(from ? b.text.substr(from) : b.text, &ids[i]);
          } catch (...) {  // out of memory, say: rethrown once every thread has finished
            failed[i] = std::current_exception();
          }
        });
      for (auto& w : workers) w.join();
      for (auto& e : failed)
        if (e) std::rethrow_exception(e);
      for (const auto& part : ids) {
        if (std::fwrite(part.data(), sizeof(uint32_t), part.size(), spool) != part.size())
          throw std::runtime_error("data prepare: " + opt.output + ": cannot write the token spool next to it (" +
                                   free_space_note(opt.output) + ")");
        count += part.size();
      }
    }
    runs.back().count = count - runs.back().offset / sizeof(uint32_t);
  }
  if (std::fflush(spool) != 0)
    throw std::runtime_error("data prepare: " + opt.output + ": cannot write the token spool next to it (" +
                             free_space_note(opt.output) + ")");
  return runs;
}

// The tokenizer model file --tokenizer-model names: the file itself, or a Hugging Face model
// directory's tokenizer.model (the Llama family keeps its SentencePiece model there).
std::string tokenizer_model_file(const std::string& given) {
  std::error_code ec;
  if (given.empty() || !std::filesystem::is_directory(given, ec)) return given;
  const std::string file = given + "/tokenizer.model";
  if (!std::filesystem::exists(file, ec))
    throw SpecError("data prepare: --tokenizer-model " + given +
                    ": a folder without tokenizer.model (a Hugging Face Llama-family directory keeps its "
                    "SentencePiece model there; a tokenizer.json alone is not read)");
  return file;
}

// What data prepare reads: the text files and a tokenizer model.
std::vector<std::string> inputs_of(const PrepareOptions& opt) {
  std::vector<std::string> inputs = opt.inputs;
  if (!opt.tokenizer_model.empty()) inputs.push_back(tokenizer_model_file(opt.tokenizer_model));
  return inputs;
}

// The shards of an earlier sharded output OUTPUT's stem_NNNNN.ext, in order.
std::vector<std::string> existing_shards(const std::string& output) {
  std::vector<std::string> found;
  for (size_t k = 0;; ++k) {
    std::error_code ec;
    if (!fs::exists(shard_path(output, k), ec)) return found;
    found.push_back(shard_path(output, k));
  }
}

// Everything that can be refused before the inputs are read (a tokenizer's training can take
// minutes: an existing output is refused here, not only when the writer would find it). A sharded
// output's earlier shards are its output: each must be a token file that --force may replace.
void check_options(const PrepareOptions& opt) {
  if (opt.inputs.empty()) throw SpecError("data prepare: no --input file given");
  if (opt.output.empty()) throw SpecError("data prepare: no --output file given");
  if (!(opt.val_fraction >= 0 && opt.val_fraction < 1))
    throw SpecError("data prepare: --val-fraction " + std::to_string(opt.val_fraction) + " is not in [0, 1)");
  if (!(opt.shard_mb >= 0)) throw SpecError("data prepare: --shard-mb must not be negative");
  if (opt.shard_mb > 0) {
    const std::vector<std::string> earlier = existing_shards(opt.output);
    for (const std::string& shard : earlier.empty() ? std::vector<std::string>{shard_path(opt.output, 0)} : earlier)
      check_output(shard, token_file_output("data prepare", inputs_of(opt), opt.force));
  } else {
    check_output(opt.output, token_file_output("data prepare", inputs_of(opt), opt.force));
  }
  switch (opt.tokenizer) {
    case TokenizerKind::bytes:
      if (opt.vocab_size || !opt.tokenizer_model.empty())
        throw SpecError("data prepare: --vocab-size and --tokenizer-model need --tokenizer sentencepiece");
      break;
    case TokenizerKind::sentencepiece:
      if (opt.tokenizer_model.empty() && opt.vocab_size <= 0)
        throw SpecError(
            "data prepare: --tokenizer sentencepiece needs --vocab-size N (pieces to train) or --tokenizer-model FILE");
      if (!opt.tokenizer_model.empty() && opt.vocab_size > 0)
        throw SpecError(
            "data prepare: --vocab-size with --tokenizer-model: the model's own vocabulary is used, drop --vocab-size");
      if (!(opt.sample_mb > 0)) throw SpecError("data prepare: --sample-mb must be positive");
      break;
    case TokenizerKind::none:
      throw SpecError(
          "data prepare: --tokenizer none: a token file prepared from text has a tokenizer (bytes or sentencepiece)");
  }
}

// The tokenizer the options name: bytes, a SentencePiece model file, or one trained on the
// inputs (`total` bytes). `note` says which, for the file's record.
Tokenizer prepare_tokenizer(const PrepareOptions& opt, uint64_t total, std::string& note) {
  if (opt.tokenizer != TokenizerKind::sentencepiece) return Tokenizer{};
  Tokenizer tok;
  if (!opt.tokenizer_model.empty()) {
    const std::string file = tokenizer_model_file(opt.tokenizer_model);
    tok = Tokenizer::sentencepiece(read_input_file(file, "data prepare: --tokenizer-model", 1 << 30),
                                   "data prepare: --tokenizer-model " + file);
    note = "tokenizer " + file;
  } else {
    SentencePieceTraining t{opt.inputs, opt.vocab_size, opt.model_type,
                            static_cast<uint64_t>(opt.sample_mb * (1 << 20))};
    tok = Tokenizer::sentencepiece(train_sentencepiece(t, total, &note), "the trained tokenizer");
  }
  std::fprintf(stderr, "data prepare: %s\n", note.c_str());
  if (!tok.normalisation().empty())
    std::fprintf(stderr,
                 "data prepare: warning: --tokenizer-model %s normalises its text: %s (the token file "
                 "records it; data inspect and generate say so)\n",
                 opt.tokenizer_model.c_str(), tok.normalisation().c_str());
  return tok;
}

// The training stream (each run's head) and the held-out stream (each run's tail), in input order.
struct Part {
  const TokenRun* run;
  uint64_t from, count;
};
struct Streams {
  std::vector<Part> train, val;
  uint64_t n_train = 0, n_val = 0;
};
struct Written {
  size_t shards = 1;
  uint64_t documents = 0;
};

// Tokens [from, from + n) of a stream, appended.
void append_stream(const std::vector<Part>& parts, uint64_t from, uint64_t n, TokenFileWriter& out,
                   Progress& progress) {
  for (const Part& p : parts) {
    if (from >= p.count) {
      from -= p.count;
      continue;
    }
    const uint64_t k = std::min(n, p.count - from);
    append_range(*p.run, p.from + from, k, out, progress);
    n -= k;
    from = 0;
    if (n == 0) return;
  }
}

// The streams as one token file (w.output) or as shards (--shard-mb): shard k holds
// [k n / shards, (k + 1) n / shards) of each. An earlier, larger set's last shards are no part of
// this one (a glob would still find them): removed once the new set is in place.
Written write_token_files(const PrepareOptions& opt, const TokenFileWriter::Options& w, const Streams& s,
                          Progress& progress, const std::string& sources) {
  Written out;
  const double stored = static_cast<double>(s.n_train + s.n_val) * w.width;
  if (opt.shard_mb > 0) out.shards = static_cast<size_t>(std::max(1.0, std::ceil(stored / (opt.shard_mb * 1e6))));
  const std::vector<std::string> earlier = opt.shard_mb > 0 ? existing_shards(opt.output) : std::vector<std::string>{};
  for (size_t k = 0; k < out.shards; ++k) {
    TokenFileWriter::Options wk = w;
    if (opt.shard_mb > 0) wk.output = shard_path(opt.output, k);
    const uint64_t t0 = s.n_train * k / out.shards, t1 = s.n_train * (k + 1) / out.shards;
    const uint64_t v0 = s.n_val * k / out.shards, v1 = s.n_val * (k + 1) / out.shards;
    TokenFileWriter file(wk, t1 - t0, v1 - v0);
    append_stream(s.train, t0, t1 - t0, file, progress);
    append_stream(s.val, v0, v1 - v0, file, progress);
    file.commit(sources);
    out.documents += file.documents();
  }
  for (size_t k = out.shards; k < earlier.size(); ++k) fs::remove(earlier[k]);
  return out;
}

// The token file(s) data prepare writes: the tokenizer's, with the end-of-document token (byte
// tokens get one, 256, beyond their vocabulary) where documents are kept.
TokenFileWriter::Options writer_options(const PrepareOptions& opt, const Tokenizer& tok, int separator) {
  TokenFileWriter::Options w;
  w.output = opt.output;
  w.force = opt.force;
  w.compress = opt.compress;
  w.what = "data prepare";
  w.inputs = inputs_of(opt);
  w.vocab = tok.vocab_size() + (tok.is_bytes() && separator >= 0 ? 1 : 0);
  w.width = token_width_for(w.vocab);
  w.document_token = separator;
  w.tokenizer = tok.kind();
  w.tokenizer_model = tok.model_bytes();
  return w;
}

}  // namespace

std::string shard_path(const std::string& output, size_t k) {
  const fs::path p(output);
  char number[16];
  std::snprintf(number, sizeof number, "_%05zu", k);
  return (p.parent_path() / (p.stem().string() + number + p.extension().string())).string();
}

std::string prepare_token_file(const PrepareOptions& given) {
  PrepareOptions opt = given;
  opt.inputs = expand_inputs(given.inputs);
  check_options(opt);
  const uint64_t total = input_bytes(opt.inputs, "data prepare: --input");
  std::string note;
  const Tokenizer tok = prepare_tokenizer(opt, total, note);
  // Documents are kept where asked or where records are documents; each then ends with the
  // tokenizer's end-of-document token (byte tokens get one: 256).
  const bool documents = opt.documents != DocumentSplit::none ||
                         std::any_of(opt.inputs.begin(), opt.inputs.end(), [](auto& in) { return is_jsonl(in); });
  const int separator = !documents ? -1 : tok.is_bytes() ? 256 : tok.special_tokens().eos.id;
  if (documents && separator < 0)
    throw SpecError("data prepare: --tokenizer-model " + opt.tokenizer_model +
                    " has no end-of-document token (</s>) to end each document with: --documents none, and no "
                    ".jsonl inputs");
  // Plain byte tokens are the files' bytes, copied as they are; anything else is encoded first.
  const bool copy_bytes = tok.is_bytes() && !documents &&
                          std::none_of(opt.inputs.begin(), opt.inputs.end(),
                                       [](auto& in) { return in.size() > 3 && in.substr(in.size() - 3) == ".gz"; });
  const TokenFileWriter::Options w = writer_options(opt, tok, separator);
  nlohmann::json how = {{"val_fraction", opt.val_fraction}, {"tokenizer", tok.name()}};
  if (documents) how["documents"] = opt.documents != DocumentSplit::none ? name_of(opt.documents) : "records";
  if (!tok.is_bytes()) how["tokenizer_note"] = note;
  if (!tok.normalisation().empty()) how["tokenizer_normalises"] = tok.normalisation();
  // Every input gives its last --val-fraction to /val, so held-out text comes from every source;
  // where documents are kept, the last whole documents (the cut moves back to a document's end).
  auto held_out = [&](const TokenRun& r) {
    const uint64_t cut = r.count - static_cast<uint64_t>(std::floor(static_cast<double>(r.count) * opt.val_fraction));
    return r.count - (separator >= 0 && cut < r.count ? document_cut(r, cut, separator) : cut);
  };

  const std::string spool_path = opt.output + ".spool." + std::to_string(::getpid());
  struct Remove {
    std::string path;
    ~Remove() {
      std::error_code ignored;
      fs::remove(path, ignored);
    }
  } remove_spool{spool_path};
  std::vector<TokenRun> runs;
  if (copy_bytes) {
    for (const auto& in : opt.inputs) runs.push_back({in, 0, static_cast<uint64_t>(fs::file_size(in)), 1, in});
  } else {
    runs = encode_to_spool(opt, tok, separator, spool_path, total);
  }
  Streams streams;
  for (const TokenRun& r : runs) {
    const uint64_t held = held_out(r);
    streams.train.push_back({&r, 0, r.count - held});
    streams.val.push_back({&r, r.count - held, held});
    streams.n_val += held;
    streams.n_train += r.count - held;
  }
  const uint64_t n_train = streams.n_train, n_val = streams.n_val, count = n_train + n_val;
  Progress progress(copy_bytes ? "read" : "written", copy_bytes ? total : 4 * count);
  const Written written =
      write_token_files(opt, w, streams, progress, sources_json(opt.inputs, "pipetrain data prepare", how.dump()));
  const size_t shards = written.shards;
  const uint64_t documents_kept = written.documents;

  std::ostringstream summary;
  summary << (opt.shard_mb > 0 ? shard_path(opt.output, 0) + " .. " + shard_path(opt.output, shards - 1) : opt.output)
          << ": " << n_train << " train and " << n_val << " validation tokens (" << tok.name() << ", vocab " << w.vocab
          << ", " << token_dtype_name(w.width) << ") from " << opt.inputs.size() << " file(s), "
          << human_bytes(static_cast<double>(total));
  if (!tok.is_bytes())
    summary << ", " << std::setprecision(3) << static_cast<double>(total) / std::max<uint64_t>(1, count)
            << " bytes per token";
  if (documents) summary << ", " << documents_kept << " documents, each ended by token " << separator;
  if (opt.compress) summary << ", gzip";
  if (opt.shard_mb > 0) summary << ", in " << shards << " shards";
  return summary.str();
}

namespace {

// A token file's facts, as `data inspect --json` prints them and the text is written from.
nlohmann::json token_file_facts(const std::string& path, int sample_tokens) {
  const TokenFileInfo info = read_token_file_info(path);
  const Tokenizer tok = info.tokenizer == TokenizerKind::sentencepiece
                            ? Tokenizer::sentencepiece(info.tokenizer_model, path + ": /tokenizer_model")
                            : Tokenizer();
  nlohmann::json j = {{"path", path},
                      {"format", info.format},
                      {"train_tokens", info.train},
                      {"val_tokens", info.val},
                      {"dtype", token_dtype_name(info.width)},
                      {"compressed", info.compressed},
                      {"vocab_size", info.vocab_size},
                      {"tokenizer", name_of(info.tokenizer)}};
  if (!tok.is_bytes()) {
    j["tokenizer_pieces"] = tok.vocab_size();
    j["tokenizer_model_bytes"] = info.tokenizer_model.size();
  }
  if (!tok.normalisation().empty()) j["tokenizer_normalises"] = tok.normalisation();
  if (info.document_token >= 0)
    j["documents"] = {{"token", info.document_token}, {"train", info.train_documents}, {"val", info.val_documents}};
  j["sources"] = nlohmann::json::parse(info.sources.empty() ? "null" : info.sources, nullptr, false);
  if (j["sources"].is_discarded()) j["sources"] = info.sources;  // not JSON: kept as the file holds it
  const size_t n = std::min<size_t>(info.train, static_cast<size_t>(std::max(0, sample_tokens)));
  std::vector<uint32_t> ids(n);
  if (n > 0) TokenFile(path, Split::train).read(0, n, ids.data());
  j["first_ids"] = ids;
  if (n > 0 && info.tokenizer != TokenizerKind::none)
    j["first_decoded"] = tok.decode(std::vector<int>(ids.begin(), ids.end()));
  return j;
}

// The sources record as lines: who made the file and when, each input, then any other settings.
void sources_text(const nlohmann::json& sources, std::ostringstream& out) {
  if (sources.is_null()) return;
  if (!sources.is_object()) {
    out << "  sources " << sources.dump() << "\n";
    return;
  }
  out << "  made by " << sources.value("by", std::string("(not recorded)"));
  if (sources.contains("created")) out << " at " << sources.value("created", std::string());
  out << "\n";
  if (sources.contains("inputs") && sources["inputs"].is_array())
    for (const auto& in : sources["inputs"])
      out << "    from " << in.value("path", std::string("?")) << " (" << human_bytes(in.value("bytes", 0.0)) << ")\n";
  for (const auto& [key, value] : sources.items())
    if (key != "by" && key != "created" && key != "inputs")
      out << "    " << key << " " << (value.is_string() ? value.get<std::string>() : value.dump()) << "\n";
}

}  // namespace

std::string inspect_token_file(const std::string& path, int sample_tokens, bool json) {
  const nlohmann::json f = token_file_facts(path, sample_tokens);
  if (json) return f.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::ostringstream out;
  const std::string dtype = f["dtype"], gzip = f["compressed"].get<bool>() ? "  gzip" : "";
  out << path << ": token file format " << f["format"] << "\n";
  out << "  /train  " << f["train_tokens"] << " tokens  " << dtype << gzip << "\n";
  out << "  /val    " << f["val_tokens"] << " tokens  " << dtype << gzip << "\n";
  out << "  vocab_size " << f["vocab_size"] << "  tokenizer " << f["tokenizer"].get<std::string>();
  if (f.contains("tokenizer_pieces"))
    out << " (" << f["tokenizer_pieces"] << " pieces, model " << human_bytes(f["tokenizer_model_bytes"].get<double>())
        << ")";
  out << "\n";
  if (f.contains("documents")) {
    const auto& d = f["documents"];
    out << "  documents: " << d["train"] << " in /train (" << std::fixed << std::setprecision(1)
        << f["train_tokens"].get<double>() / std::max(1.0, d["train"].get<double>()) << " tokens each), " << d["val"]
        << " in /val, each ended by token " << d["token"] << "\n";
    out.unsetf(std::ios::fixed);
  }
  if (f.contains("tokenizer_normalises"))
    out << "  the tokenizer normalises its text: " << f["tokenizer_normalises"].get<std::string>()
        << " (decoded text is not the original)\n";
  sources_text(f["sources"], out);
  const auto& ids = f["first_ids"];
  if (!ids.empty()) {
    out << "  first ids:";
    for (size_t i = 0; i < std::min<size_t>(ids.size(), 16); ++i) out << " " << ids[i];
    out << (ids.size() > 16 ? " ..." : "") << "\n";
    if (!f.contains("first_decoded")) out << "  (imported ids: their tokenizer is not part of the file)\n";
    else
      out << "  first " << ids.size()
          << " tokens decoded: " << f["first_decoded"].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
          << "\n";
  }
  return out.str();
}

std::string inspect_run_data(const RunSpec& spec, bool json) {
  if (spec.data.sources.empty()) {
    if (spec.data.source == DataSource::hdf5) return inspect_token_file(spec.data.path, 0, json);
    const std::string what = spec.data.source == DataSource::text ? "the bytes of " + spec.data.path
                                                                  : std::string("the built-in synthetic byte language");
    return json ? nlohmann::json{{"source", name_of(spec.data.source)}, {"what", what}}.dump(2) + "\n"
                : "data.source = " + std::string(name_of(spec.data.source)) + ": " + what + "\n";
  }
  const double t0 = now_s();
  Mixture train(spec, Split::train);
  std::unique_ptr<Mixture> val;
  std::string no_val;
  try {
    val = std::make_unique<Mixture>(spec, Split::val);
  } catch (const SpecError& e) {
    no_val = e.what();
  }
  const double seconds = now_s() - t0;
  // Each source's share of the first 65,536 global samples: what the weights' pattern deals it.
  const int64_t block = 65536;
  nlohmann::ordered_json j = {{"sources", nlohmann::ordered_json::array()}, {"open_s", seconds}};
  size_t files = 0, read = 0;
  for (int s = 0; s < train.sources(); ++s) {
    const TokenSource& t = train.source(s);
    nlohmann::ordered_json src = {{"name", spec.data.sources[s].name},
                                  {"path", spec.data.sources[s].path},
                                  {"weight", spec.data.sources[s].weight},
                                  {"share", static_cast<double>(train.pattern().taken(s, block)) / block},
                                  {"files", t.files()},
                                  {"tokenizer", name_of(t.tokenizer())},
                                  {"train_tokens", t.tokens()},
                                  {"train_windows", t.windows()}};
    if (t.document_token() >= 0) src["document_token"] = t.document_token();
    if (val) src["val_tokens"] = val->source(s).tokens(), src["val_windows"] = val->source(s).windows();
    j["sources"].push_back(src);
    files += t.files() + (val ? val->source(s).files() : 0);
  }
  read = train.files_read() + (val ? val->files_read() : 0);
  j["files"] = files;
  j["files_read"] = read;
  if (!no_val.empty()) j["no_validation"] = no_val;
  if (json) return j.dump(2) + "\n";
  std::ostringstream out;
  out << "a mixture of " << train.sources() << " sources, windows of model.seq_len + 1 = " << spec.model.seq_len + 1
      << " tokens\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %-16s %7s %7s %6s %14s %12s %12s %12s  %s\n", "source", "weight", "share",
                "files", "train tokens", "windows", "val tokens", "val windows", "tokenizer");
  out << line;
  for (const auto& src : j["sources"]) {
    std::snprintf(line, sizeof line, "  %-16s %7.3g %6.2f%% %6zu %14llu %12lld %12s %12s  %s%s\n",
                  src["name"].get<std::string>().c_str(), src["weight"].get<double>(), 100 * src["share"].get<double>(),
                  src["files"].get<size_t>(), static_cast<unsigned long long>(src["train_tokens"].get<uint64_t>()),
                  static_cast<long long>(src["train_windows"].get<int64_t>()),
                  src.contains("val_tokens") ? std::to_string(src["val_tokens"].get<uint64_t>()).c_str() : "-",
                  src.contains("val_windows") ? std::to_string(src["val_windows"].get<int64_t>()).c_str() : "-",
                  src["tokenizer"].get<std::string>().c_str(),
                  src.contains("document_token")
                      ? (", documents end with " + std::to_string(src["document_token"].get<int64_t>())).c_str()
                      : "");
    out << line;
  }
  if (!no_val.empty()) out << "  no validation: " << no_val << "\n";
  std::snprintf(line, sizeof line, "opened in %.3f s: %zu files, %zu read, the rest known from their folders' %s\n",
                seconds, files, read, kIndexName);
  out << line;
  return out.str();
}

}  // namespace pipetrain
