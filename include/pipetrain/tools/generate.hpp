// `pipetrain generate`: a checkpoint's model (any saved layout) in one process, sampling text
// token by token: bytes, or the SentencePiece model the checkpoint carries (prompt encoded,
// output decoded with it). With the KV cache (default) each new token runs the blocks on that token alone
// against the cached keys and values of the tokens before it, so a token costs the same however
// long the text so far; without it (--no-cache) each token recomputes the whole window through
// Stage::forward, the training code: the cache's reference (the same arithmetic in another
// summation order, so the same tokens unless a draw falls within rounding of a boundary). The context slides when full:
// the last seq_len / 2 tokens are kept and the cache rebuilt from them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "pipetrain/util/errors.hpp"

namespace pipetrain {

struct GenerateOptions {
  std::string checkpoint, config;      // config empty: the checkpoint's own spec
  std::vector<std::string> overrides;  // --set
  std::string prompt;
  int tokens = 200;
  double temperature = 1.0;  // 0: always the most likely token
  int top_k = 0;             // 0: all tokens
  uint64_t seed = 0;
  bool use_cache = true;
};

// Prints the prompt and its continuation to stdout, a summary to stderr; returns the exit code
// (2 for bad input, naming it).
ExitCode run_generate(const GenerateOptions& opt);

// The token drawn from `probs` (V values summing to 1) for a uniform u in [0, 1): probabilities
// raised to 1/temperature, the top_k largest kept (ties to the lower token), renormalised,
// inverse CDF in token order. temperature <= 0: the most likely token.
int sample_token(const float* probs, int V, double temperature, int top_k, double u);

// `pipetrain generate ...`: args are the words after the command.
ExitCode generate_command(const std::vector<std::string>& args);

}  // namespace pipetrain
