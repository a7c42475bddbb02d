#include "pipetrain/interop/llmc_model.hpp"

#include "pipetrain/interop/gpt2_layout.hpp"
#include "pipetrain/model/block_tensors.hpp"
#include "pipetrain/util/errors.hpp"

namespace pipetrain {
namespace {

constexpr int kHeaderInts = 256;
constexpr int kVersionFp32 = 3, kVersionBf16 = 5;

// Elements of a tensor as the file stores it (wte with its padding rows).
std::vector<int64_t> stored_shape(const LlmcHeader& h, const std::string& name) {
  const int64_t C = h.channels;
  if (name == "wte.weight") return {h.padded_vocab, C};
  if (name == "wpe.weight") return {h.max_seq_len, C};
  int block;
  std::string tensor;
  if (split_block_name(name, &block, &tensor))
    for (const BlockTensor& t : kGpt2Block)
      if (tensor == t.name) {
        std::vector<int64_t> s;
        for (int d : shape_of(t, gpt2_block_shape(h.channels))) s.push_back(d);
        return s;
      }
  return {C};  // ln_f.weight, ln_f.bias
}

}  // namespace

bool LlmcFile::looks_like(const std::string& path) { return file_starts_with(path, &kLlmcMagic, 4); }

LlmcFile::LlmcFile(const std::string& path) : file_(path) {
  auto bad = [&](const std::string& why) { return SpecError(path + ": not a valid llm.c model file (" + why + ")"); };
  int32_t h[kHeaderInts];
  if (!file_.read_at(0, h, sizeof h)) throw bad("shorter than its 1024-byte header");
  if (h[0] != kLlmcMagic) throw bad("magic number " + std::to_string(h[0]) + ", not " + std::to_string(kLlmcMagic));
  if (h[1] != kVersionFp32 && h[1] != kVersionBf16)
    throw bad("version " + std::to_string(h[1]) + "; pipetrain reads 3 (fp32) and 5 (bf16)");
  h_.dtype = h[1] == kVersionFp32 ? StoredFloat::f32 : StoredFloat::bf16;
  h_.max_seq_len = h[2];
  h_.vocab = h[3];
  h_.n_layer = h[4];
  h_.n_head = h[5];
  h_.channels = h[6];
  h_.padded_vocab = h[7];
  for (int i = 2; i <= 7; ++i)
    if (h[i] <= 0 || h[i] > (1 << 24)) throw bad("header field " + std::to_string(i) + " = " + std::to_string(h[i]));
  if (h_.n_layer > 4096) throw bad(std::to_string(h_.n_layer) + " layers");  // model.n_layer's limit
  if (h_.padded_vocab < h_.vocab) throw bad("padded vocabulary " + std::to_string(h_.padded_vocab) + " < vocabulary");
  uint64_t offset = sizeof h;
  for (const std::string& name : llmc_order(h_.n_layer)) {
    offset_[name] = offset;
    offset += static_cast<uint64_t>(element_count(stored_shape(h_, name))) * stored_bytes(h_.dtype);
  }
  if (file_.size() != offset)
    throw bad(std::to_string(file_.size()) + " bytes where its header describes " + std::to_string(offset));
}

std::optional<std::vector<int64_t>> LlmcFile::shape(const std::string& name) const {
  if (!offset_.count(name)) return std::nullopt;
  if (name == "wte.weight") return std::vector<int64_t>{h_.vocab, h_.channels};
  return stored_shape(h_, name);
}

void LlmcFile::read(const std::string& name, float* out) const {
  const auto s = shape(name);
  if (!s) throw SpecError(file_.path() + ": the llm.c model has no tensor " + name);
  const size_t n = static_cast<size_t>(element_count(*s));  // wte: its first V rows, a prefix of the stored table
  std::vector<unsigned char> bytes(n * stored_bytes(h_.dtype));
  if (!file_.read_at(offset_.at(name), bytes.data(), bytes.size()))
    throw SpecError(file_.path() + ": cannot read " + name);
  decode_floats(bytes.data(), n, h_.dtype, out);
}

void write_llmc(BinaryWriter& out, const LlmcHeader& h,
                const std::function<void(const std::string& name, float* out)>& fill) {
  int32_t header[kHeaderInts] = {0};
  header[0] = kLlmcMagic;
  header[1] = h.dtype == StoredFloat::bf16 ? kVersionBf16 : kVersionFp32;
  header[2] = h.max_seq_len;
  header[3] = h.vocab;
  header[4] = h.n_layer;
  header[5] = h.n_head;
  header[6] = h.channels;
  header[7] = h.padded_vocab;
  out.write(header, sizeof header);
  std::vector<float> values;
  std::vector<unsigned char> bytes;
  for (const std::string& name : llmc_order(h.n_layer)) {
    const size_t n = static_cast<size_t>(element_count(stored_shape(h, name)));
    values.assign(n, 0.f);  // wte's padding rows stay zero
    fill(name, values.data());
    bytes.resize(n * stored_bytes(h.dtype));
    encode_floats(values.data(), n, h.dtype, bytes.data());
    out.write(bytes.data(), bytes.size());
  }
}

}  // namespace pipetrain
