#include "pipetrain/data/tokenizer.hpp"

#include <fcntl.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <thread>
#include <unordered_map>

#include "pipetrain/data/text_inputs.hpp"
#include "pipetrain/util/errors.hpp"
#include "pipetrain/util/files.hpp"

namespace pipetrain {
namespace {

constexpr size_t kMaxPiece = 64 << 10;  // bytes of text encoded at once

// Lines of the inputs (as data prepare reads them: .gz decompressed, a .jsonl record's text ending
// a line), each cut into encoding pieces, every `stride`-th line only.
class LineSample : public sentencepiece::SentenceIterator {
 public:
  LineSample(const std::vector<std::string>& inputs, uint64_t stride) : inputs_(inputs), stride_(stride) { Next(); }
  bool done() const override { return done_; }
  void Next() override {
    while (true) {
      if (++piece_ < pieces_.size()) {
        value_ = pieces_[piece_];
        if (!value_.empty()) {
          ++text_given_;
          return;
        }
        continue;
      }
      if (!next_line()) {
        done_ = true;
        return;
      }
      pieces_ = encoding_pieces(line_);
      piece_ = static_cast<size_t>(-1);
    }
  }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return {}; }
  uint64_t lines_used() const { return used_; }
  uint64_t lines_seen() const { return line_no_; }
  uint64_t bytes_used() const { return bytes_; }
  uint64_t text_given() const { return text_given_; }  // non-empty pieces handed to the trainer

 private:
  bool next_line() {
    while (true) {
      if (at_ >= block_.text.size()) {
        if (!in_ || !in_->next(block_, 1 << 20)) {
          if (file_ == inputs_.size()) return false;
          in_ = std::make_unique<TextInput>(inputs_[file_++], DocumentSplit::none);
          block_ = {};
        }
        at_ = 0;
        record_ = 0;
        continue;
      }
      while (record_ < block_.ends.size() && block_.ends[record_] <= at_) ++record_;
      const size_t end = std::min(block_.text.find('\n', at_),
                                  record_ < block_.ends.size() ? block_.ends[record_] : block_.text.size());
      line_.assign(block_.text, at_, end - at_);
      at_ = end < block_.text.size() && block_.text[end] == '\n' ? end + 1 : end;
      if (line_no_++ % stride_ == 0) {
        ++used_;
        bytes_ += line_.size() + 1;
        return true;
      }
    }
  }
  const std::vector<std::string>& inputs_;
  uint64_t stride_, line_no_ = 0, used_ = 0, bytes_ = 0, text_given_ = 0;
  size_t file_ = 0, piece_ = 0;
  std::unique_ptr<TextInput> in_;
  TextBlock block_;
  size_t at_ = 0, record_ = 0;  // where the next line starts in block_, the record holding it
  std::string line_, value_;
  std::vector<std::string> pieces_;
  bool done_ = false;
};

// Sends stderr to /dev/null while it lives (SentencePiece's trainer logs hundreds of lines there;
// what went wrong comes back in its status), and back however the scope is left.
class QuietStderr {
 public:
  QuietStderr() : saved_(::dup(2)) {
    std::fflush(stderr);
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) {
      ::dup2(null, 2);
      ::close(null);
    }
  }
  ~QuietStderr() {
    std::fflush(stderr);
    if (saved_ >= 0) {
      ::dup2(saved_, 2);
      ::close(saved_);
    }
  }
  QuietStderr(const QuietStderr&) = delete;
  QuietStderr& operator=(const QuietStderr&) = delete;

 private:
  int saved_;
};

}  // namespace

size_t text_cut(const std::string& text, size_t from, size_t max) {
  if (text.size() - from <= max) return text.size();
  const size_t space = text.rfind(' ', from + max);
  if (space != std::string::npos && space > from) return space;  // the space starts the next piece
  size_t cut = from + max;
  while (cut > from + 1 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // UTF-8 continuation
  return cut;
}

std::vector<std::string> encoding_pieces(const std::string& line) {
  std::vector<std::string> pieces;
  for (size_t from = 0; from < line.size() || pieces.empty();) {
    const size_t cut = text_cut(line, from, kMaxPiece);
    pieces.push_back(line.substr(from, cut - from));
    from = cut;
  }
  return pieces;
}

Tokenizer::Tokenizer() = default;

Tokenizer Tokenizer::sentencepiece(const std::string& model_bytes, const std::string& origin) {
  Tokenizer t;
  t.sp_ = std::make_shared<sentencepiece::SentencePieceProcessor>();
  if (!t.sp_->LoadFromSerializedProto(model_bytes).ok()) throw SpecError(origin + ": not a SentencePiece model");
  t.model_ = model_bytes;
  std::vector<int> ids;
  t.sp_->Encode("\n", &ids);
  t.newline_.assign(ids.begin(), ids.end());
  // Text is encoded line by line with the newline's ids between lines. A model that normalises
  // whitespace (SentencePiece's default, T5's, ...) cannot give a newline back: the user chose it,
  // so it is used, and what it does to the text is said (normalisation()).
  if (ids.empty() || t.decode(ids) != "\n") {
    std::vector<uint32_t> two_lines;
    t.encode("a\nb", &two_lines);
    const std::string back = t.decode(std::vector<int>(two_lines.begin(), two_lines.end()));
    t.normalisation_ = back == "a b" || back == " a b" ? "newlines become spaces"
                       : back == "ab"                  ? "newlines vanish (lines join)"
                                                       : "newlines do not come back as newlines";
  }
  return t;
}

int Tokenizer::vocab_size() const { return sp_ ? sp_->GetPieceSize() : 256; }

SpecialTokens Tokenizer::special_tokens() const {
  SpecialTokens s;
  if (!sp_) return s;
  auto token = [&](int id) {
    return id >= 0 && id < sp_->GetPieceSize() ? SpecialTokens::Token{id, sp_->IdToPiece(id)} : SpecialTokens::Token{};
  };
  s.unk = token(sp_->unk_id());
  s.bos = token(sp_->bos_id());
  s.eos = token(sp_->eos_id());
  s.pad = token(sp_->pad_id());
  return s;
}

void Tokenizer::encode(const std::string& text, std::vector<uint32_t>* out) const {
  if (!sp_) {
    out->insert(out->end(), reinterpret_cast<const unsigned char*>(text.data()),
                reinterpret_cast<const unsigned char*>(text.data()) + text.size());
    return;
  }
  std::vector<int> ids;
  size_t from = 0;
  while (from <= text.size()) {
    size_t end = text.find('\n', from);
    const bool newline = end != std::string::npos;
    if (!newline) end = text.size();
    for (const std::string& piece : encoding_pieces(text.substr(from, end - from))) {
      if (piece.empty()) continue;
      sp_->Encode(piece, &ids);
      out->insert(out->end(), ids.begin(), ids.end());
    }
    if (newline) out->insert(out->end(), newline_.begin(), newline_.end());
    from = end + 1;
  }
}

std::string Tokenizer::decode(const std::vector<int>& ids) const {
  std::string text;
  const int known = vocab_size();
  for (size_t from = 0; from < ids.size();) {  // runs of known ids, decoded together
    size_t end = from;
    while (end < ids.size() && ids[end] >= 0 && ids[end] < known) ++end;
    if (!sp_) {
      for (size_t i = from; i < end; ++i) text += static_cast<char>(ids[i]);
    } else if (end > from) {
      std::string part;
      sp_->Decode(std::vector<int>(ids.begin() + from, ids.begin() + end), &part);
      text += part;
    }
    if (end < ids.size()) {
      text += "<" + std::to_string(ids[end]) + ">";
      ++end;
    }
    from = end;
  }
  return text;
}

std::string train_sentencepiece(const SentencePieceTraining& t, uint64_t total, std::string* note) {
  if (t.model_type != "bpe" && t.model_type != "unigram")
    throw SpecError("data prepare: --model-type " + t.model_type + " (bpe or unigram)");
  if (t.vocab_size < 260)
    throw SpecError("data prepare: --vocab-size " + std::to_string(t.vocab_size) +
                    " is too small for a SentencePiece model with byte fallback (at least 260: 256 bytes, "
                    "<unk>, <s>, </s> and a piece)");
  const uint64_t stride = std::max<uint64_t>(1, (total + t.sample_bytes - 1) / std::max<uint64_t>(1, t.sample_bytes));
  LineSample lines(t.inputs, stride);
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", t.model_type},
      {"vocab_size", std::to_string(t.vocab_size)},
      {"byte_fallback", "true"},         // every byte has a token: no text is ever unknown
      {"character_coverage", "0.9995"},  // rare characters go to bytes rather than pieces
      {"normalization_rule_name", "identity"},
      {"add_dummy_prefix", "false"},  // no extra "▁" in front of every line and every cut piece
      {"remove_extra_whitespaces", "false"},
      {"split_digits", "true"},
      {"max_sentence_length", std::to_string(kMaxPiece)},
      {"input_sentence_size", "0"},  // the sample is ours: every line the iterator gives
      {"num_threads", std::to_string(std::max(1u, std::thread::hardware_concurrency()))},
  };
  std::string model;
  sentencepiece::util::Status status;
  {
    QuietStderr quiet;
    status = sentencepiece::SentencePieceTrainer::Train(args, &lines, &model);
  }
  if (lines.text_given() == 0) {  // SentencePiece would only say "[!sentences_.empty()]"
    std::string files;
    for (const auto& in : t.inputs) files += (files.empty() ? "" : ", ") + in;
    throw SpecError("data prepare: --input " + files + ": no text to train a SentencePiece tokenizer on (" +
                    (t.inputs.size() > 1 ? "they hold" : "it holds") + " only line ends" +
                    (lines.lines_used() < lines.lines_seen() ? " in the lines sampled" : "") + ")");
  }
  if (!status.ok() || model.empty()) {
    const std::string why = status.ok() ? "no model came out" : status.ToString();
    const char* hint = why.find("too high") != std::string::npos ? " (a smaller --vocab-size, or more text)"
                       : why.find("required_chars") != std::string::npos
                           ? " (a larger --vocab-size: every distinct character needs a piece)"
                           : "";
    throw SpecError("data prepare: SentencePiece could not train a " + t.model_type + " model of " +
                    std::to_string(t.vocab_size) + " pieces: " + why + hint);
  }
  if (note)
    *note = stride > 1 ? "tokenizer trained on a sample: every " + std::to_string(stride) + "th line, " +
                             human_bytes(static_cast<double>(lines.bytes_used())) + " of " +
                             human_bytes(static_cast<double>(total))
                       : "tokenizer trained on all " + human_bytes(static_cast<double>(total)) + " (" +
                             std::to_string(lines.lines_used()) + " lines)";
  return model;
}

}  // namespace pipetrain
