// llm.c's model file (train_gpt2.py write_model, train_gpt2.c gpt2_build_from_checkpoint): a header
// of 256 little-endian int32 — [0] magic 20240326, [1] version (3: fp32, 5: bf16), [2] max
// sequence length T, [3] vocabulary V, [4] layers L, [5] heads, [6] channels C, [7] padded
// vocabulary Vp (V rounded up to a multiple of 128), the rest 0 — then every parameter in
// llmc_order() (gpt2_layout.hpp), matrices [out, in], the token table Vp x C with rows from V on
// zero. The head is always the token table (llm.c ties it).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "pipetrain/interop/float_formats.hpp"
#include "pipetrain/util/binary_file.hpp"

namespace pipetrain {

constexpr int32_t kLlmcMagic = 20240326;

struct LlmcHeader {
  int max_seq_len = 0, vocab = 0, n_layer = 0, n_head = 0, channels = 0, padded_vocab = 0;
  StoredFloat dtype = StoredFloat::f32;
};

// V rounded up to a multiple of 128, as llm.c pads it.
inline int llmc_padded_vocab(int vocab) { return (vocab + 127) / 128 * 128; }

// An llm.c model file, its header checked against its size.
class LlmcFile {
 public:
  explicit LlmcFile(const std::string& path);       // SpecError naming the file
  static bool looks_like(const std::string& path);  // starts with the magic number

  const LlmcHeader& header() const { return h_; }
  // The shape of pipetrain tensor `name` here ([V, C] for the token table: the padding rows are
  // not part of the model), or nothing.
  std::optional<std::vector<int64_t>> shape(const std::string& name) const;
  void read(const std::string& name, float* out) const;  // the tensor of shape(name)

 private:
  BinaryReader file_;
  LlmcHeader h_;
  std::map<std::string, uint64_t> offset_;  // byte offset in the file of each tensor
};

// Writes a whole file: the header, then each tensor of llmc_order() as `fill(name, out)` gives it
// in pipetrain's shape ([V, C] for wte: the writer adds the zero padding rows).
void write_llmc(BinaryWriter& out, const LlmcHeader& header,
                const std::function<void(const std::string& name, float* out)>& fill);

}  // namespace pipetrain
