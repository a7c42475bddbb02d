// The run spec's choice keys (and the tools' command-line choices) as types. The schema turns the
// TOML strings into these once (parse_choice the command line's), so
// everywhere past parsing a choice is an enum (a switch the compiler checks), never a string
// compared against a literal. parallel.schedule is a choice too, but an open one: it names an
// entry of the schedule registry (schedule/registry.hpp).
#pragma once
#include <array>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>

#include "pipetrain/util/errors.hpp"

namespace pipetrain {

enum class Device { cpu, gpu };                             // run.device
enum class Dtype { fp32, bf16 };                            // model.dtype: matrix-product inputs
enum class Arch { gpt2, llama };                            // model.arch: the model family
enum class DataSource { synthetic, text, hdf5 };            // data.source
enum class RankOrder { pp, dp };                            // parallel.order: what consecutive ranks share
enum class Partition { uniform, balanced, explicit_list };  // parallel.partition (a list: explicit_list)
enum class Recompute { none, stage, block };                // parallel.recompute
enum class OnSaveError { warn, stop };                      // checkpoint.on_error
enum class StragglerAction { log, exclude, rebalance };     // log.straggler_action
enum class WaitPolicy { automatic, spin, yield };           // comm.wait ("auto")
enum class FinalizePolicy { automatic, mpi, skip };         // comm.finalize ("auto")
// The tools' command-line choices, parsed where the command line is read.
enum class CorpusFormat { llmc, nanogpt, megatron };  // data import / data export --format
enum class ExportFormat { hf, llmc };                 // export --format
enum class TokenizerKind {
  bytes,
  sentencepiece,
  none
};  // data prepare --tokenizer; a token file's (none: imported ids)
// data prepare --documents: where plain text's documents end (text_inputs.hpp).
enum class DocumentSplit { none, file, paragraph };

// Each enum's spellings in the spec, in declaration order.
template <class E>
struct Choices;
#define PIPETRAIN_CHOICES(E, ...)                          \
  template <>                                              \
  struct Choices<E> {                                      \
    static constexpr auto names = std::array{__VA_ARGS__}; \
  };
PIPETRAIN_CHOICES(Device, "cpu", "gpu")
PIPETRAIN_CHOICES(Dtype, "fp32", "bf16")
PIPETRAIN_CHOICES(Arch, "gpt2", "llama")
PIPETRAIN_CHOICES(DataSource, "synthetic", "text", "hdf5")
PIPETRAIN_CHOICES(RankOrder, "pp", "dp")
PIPETRAIN_CHOICES(Partition, "uniform", "balanced", "explicit")
PIPETRAIN_CHOICES(Recompute, "none", "stage", "block")
PIPETRAIN_CHOICES(OnSaveError, "warn", "stop")
PIPETRAIN_CHOICES(StragglerAction, "log", "exclude", "rebalance")
PIPETRAIN_CHOICES(WaitPolicy, "auto", "spin", "yield")
PIPETRAIN_CHOICES(FinalizePolicy, "auto", "mpi", "skip")
PIPETRAIN_CHOICES(CorpusFormat, "llmc", "nanogpt", "megatron")
PIPETRAIN_CHOICES(ExportFormat, "hf", "llmc")
PIPETRAIN_CHOICES(TokenizerKind, "bytes", "sentencepiece", "none")
PIPETRAIN_CHOICES(DocumentSplit, "none", "file", "paragraph")
#undef PIPETRAIN_CHOICES

// The spelling of a value, e.g. name_of(Recompute::block) == "block".
template <class E>
const char* name_of(E value) {
  return Choices<E>::names[static_cast<size_t>(value)];
}

// The value spelt `name`, if any.
template <class E>
std::optional<E> choice_named(const std::string& name) {
  for (size_t i = 0; i < Choices<E>::names.size(); ++i)
    if (name == Choices<E>::names[i]) return static_cast<E>(i);
  return std::nullopt;
}

// The value among `allowed` that `text` spells, else SpecError "<what> <text> is not one of a | b":
// how a command-line choice enters (what: "data import: --format").
template <class E>
E parse_choice(const std::string& what, const std::string& text, std::initializer_list<E> allowed) {
  std::string names;
  for (E e : allowed) {
    if (text == name_of(e)) return e;
    names += (names.empty() ? "" : " | ") + std::string(name_of(e));
  }
  throw SpecError(what + " " + text + " is not one of " + names);
}

}  // namespace pipetrain
