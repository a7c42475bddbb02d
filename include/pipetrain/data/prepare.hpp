// `pipetrain data prepare` (text files -> a token file, byte tokens or SentencePiece) and
// `pipetrain data inspect` (what a token file holds).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "pipetrain/config/choices.hpp"
#include "pipetrain/config/spec.hpp"
#include "pipetrain/data/text_inputs.hpp"

namespace pipetrain {

struct PrepareOptions {
  std::vector<std::string> inputs;  // files, globs or folders (expand_inputs): text, .gz, .jsonl
  std::string output;
  double val_fraction = 0.1;                       // the last tokens of each input
  bool compress = false;                           // gzip level 4
  bool force = false;                              // replace an existing output
  TokenizerKind tokenizer = TokenizerKind::bytes;  // bytes or sentencepiece
  int vocab_size = 0;                              // sentencepiece: pieces to train
  std::string model_type = "bpe";                  // sentencepiece: bpe | unigram
  std::string tokenizer_model;                     // sentencepiece: a .model file to use instead of training one, or a
                                                   // directory holding tokenizer.model (a Hugging Face Llama's)
  double sample_mb = 64;                           // sentencepiece: train on about this much of the text
  // Where documents end (each followed by the end-of-document token: the SentencePiece model's
  // </s>, or 256 for byte tokens, whose vocabulary is then 257); JSON Lines records always do.
  DocumentSplit documents = DocumentSplit::none;
  unsigned threads = 0;  // encoding threads; 0: the cores, at most 8
  // Shards of about this many MB of stored tokens instead of one file: OUTPUT's stem + _00000.h5, ...
  // (shard_path), each a token file with its part of /train and of /val; 0: one file.
  double shard_mb = 0;
};

// Shard k of a sharded output: "data/web.h5" -> "data/web_00003.h5".
std::string shard_path(const std::string& output, size_t k);

// Writes the token file atomically. Bad input (unreadable or empty files, an existing output
// without force, a fraction outside [0, 1), bad tokenizer options) is a SpecError naming it;
// prints progress to stderr for large inputs. Returns a summary.
std::string prepare_token_file(const PrepareOptions& opt);

// A token file's datasets, token counts, dtype, tokenizer, sources and the first
// `sample_tokens` tokens of /train decoded: as lines for a person, or (`json`) as one JSON object
// with the same facts for scripts. SpecError naming the file.
std::string inspect_token_file(const std::string& path, int sample_tokens, bool json = false);

// The data a run spec names, opened as training opens it: for a mixture each source's weight, share
// of the samples, files, tokens and windows of both splits, tokenizer, and how long opening took
// (how many files were read, the rest known from their folders' indexes); for data.path its token
// file (inspect_token_file). As lines, or (`json`) one JSON object. SpecError as training's.
std::string inspect_run_data(const RunSpec& spec, bool json = false);

}  // namespace pipetrain
