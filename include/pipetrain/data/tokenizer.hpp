// Text <-> token ids: byte tokens (vocabulary 256, the default) or a SentencePiece model (BPE or
// unigram, trained here with byte fallback so no text is unknown, or given as a .model file).
//
// SentencePiece models trained here keep text exactly: identity normalisation, no dummy prefix,
// whitespace kept, so decode(encode(text)) == text. Text is encoded line by line: a line's
// content, then the newline's own ids (its byte token), so the ids of a file are those of
// `spm_encode` for each line followed by the newline's; a line over 64 KiB is cut (at a space when
// there is one, never inside a UTF-8 character) and its parts encoded one after another.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pipetrain/config/choices.hpp"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace pipetrain {

// A tokenizer's special tokens: id and piece text, id -1 where it has none (bytes have none).
struct SpecialTokens {
  struct Token {
    int id = -1;
    std::string piece;
  };
  Token unk, bos, eos, pad;
};

class Tokenizer {
 public:
  Tokenizer();  // bytes
  // A SentencePiece model from its serialized bytes; SpecError naming `origin` if it is not one.
  static Tokenizer sentencepiece(const std::string& model_bytes, const std::string& origin);
  // What the model's normalisation does to text, "newlines become spaces"; "" when any text
  // decodes back to itself (bytes, and the models data prepare trains).
  const std::string& normalisation() const { return normalisation_; }

  bool is_bytes() const { return !sp_; }
  TokenizerKind kind() const { return sp_ ? TokenizerKind::sentencepiece : TokenizerKind::bytes; }
  const char* name() const { return name_of(kind()); }
  int vocab_size() const;
  const std::string& model_bytes() const { return model_; }  // "" for bytes
  SpecialTokens special_tokens() const;

  // Appends the ids of `text` (any bytes) to `out`. Thread-safe.
  void encode(const std::string& text, std::vector<uint32_t>* out) const;
  // The text of `ids`; an id the tokenizer does not have (a model.vocab larger than it) reads <id>.
  std::string decode(const std::vector<int>& ids) const;

 private:
  std::shared_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string model_;
  std::vector<uint32_t> newline_;  // the ids of "\n"
  std::string normalisation_;
};

// Training a SentencePiece model on text files. Inputs over `sample_bytes` are sampled: every k-th
// line, k chosen so about sample_bytes of text is used (say so in `note`).
struct SentencePieceTraining {
  std::vector<std::string> inputs;
  int vocab_size = 0;
  std::string model_type = "bpe";  // bpe | unigram
  uint64_t sample_bytes = 64ull << 20;
};
// Returns the model's bytes; SpecError (with the trainer's complaint) when it cannot train.
// `total_bytes`: the inputs' size (for the sample stride).
std::string train_sentencepiece(const SentencePieceTraining& t, uint64_t total_bytes, std::string* note);

// The pieces of `line` that are encoded one after another (64 KiB at most each, see above).
std::vector<std::string> encoding_pieces(const std::string& line);
// Where to cut `text` so that [from, cut) holds at most `max` bytes: after the last space in that
// range when there is one, else at `from + max` moved back off any UTF-8 continuation byte.
size_t text_cut(const std::string& text, size_t from, size_t max);

}  // namespace pipetrain
