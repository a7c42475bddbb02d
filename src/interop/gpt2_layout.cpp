#include "pipetrain/interop/gpt2_layout.hpp"

#include <cstdlib>

#include "pipetrain/model/block_tensors.hpp"

namespace pipetrain {
namespace {

const std::string kPrefix = "transformer.";

const BlockTensor* block_tensor(const std::string& tensor) {
  for (const BlockTensor& t : kGpt2Block)
    if (tensor == t.name) return &t;
  return nullptr;
}

}  // namespace

bool split_block_name(const std::string& name, int* block, std::string* tensor) {
  if (name.rfind("h.", 0) != 0) return false;
  char* end = nullptr;
  const long i = std::strtol(name.c_str() + 2, &end, 10);
  if (end == name.c_str() + 2 || *end != '.' || i < 0) return false;
  *block = static_cast<int>(i);
  *tensor = end + 1;
  return true;
}

std::string hf_name(const std::string& name) { return name == "lm_head.weight" ? name : kPrefix + name; }

std::string name_from_hf(const std::string& hf) {
  if (hf == "lm_head.weight") return hf;
  const std::string name = hf.rfind(kPrefix, 0) == 0 ? hf.substr(kPrefix.size()) : hf;
  int block;
  std::string tensor;
  if (split_block_name(name, &block, &tensor)) return block_tensor(tensor) ? name : "";
  for (const char* top : {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"})
    if (name == top) return name;
  return "";
}

bool hf_transposed(const std::string& name) {
  int block;
  std::string tensor;
  if (!split_block_name(name, &block, &tensor)) return false;
  const BlockTensor* t = block_tensor(tensor);
  return t && t->cols != Dim::none;
}

void transpose(const float* in, int64_t rows, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
}

std::vector<std::string> llmc_order(int n_layer) {
  // kGpt2Block lists a block's tensors in llm.c's order (ln1w, ln1b, qkvw, qkvb, attprojw,
  // attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb); a unit test pins it.
  std::vector<std::string> order = {"wte.weight", "wpe.weight"};
  for (const BlockTensor& t : kGpt2Block)
    for (int i = 0; i < n_layer; ++i) order.push_back(block_tensor_name(i, t));
  order.push_back("ln_f.weight");
  order.push_back("ln_f.bias");
  return order;
}

}  // namespace pipetrain
