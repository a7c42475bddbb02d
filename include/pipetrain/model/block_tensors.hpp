// One transformer block's tensors, in the order they sit in the parameter buffers: the single list
// from which a stage's named parameters (stage_params), the per-block pointers the layers use
// (BlockPtrs), generate's lookup by name and the initialisation are all derived. Reordering or
// adding a line here changes all of them together.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace pipetrain {

// How a tensor starts: GPT-2's init (N(0, 0.02); residual output projections N(0, 0.02/sqrt(2L)))
enum class Init { zeros, ones, normal, residual_normal };

// Addresses of one block's tensors (weights or their gradients), named as the layers use them.
struct BlockPtrs {
  float *ln1w, *ln1b, *qkvw, *qkvb, *projw, *projb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
};

struct BlockTensor {
  const char* name;  // after "h.{i}." (PyTorch's GPT-2 names)
  int rows, cols;    // shape in units of d_model: [rows * C] when cols = 0, else [rows * C, cols * C]
  bool decay;        // AdamW weight decay (the 2-D weights)
  Init init;
  float* BlockPtrs::*field;  // where its address goes
};

inline constexpr BlockTensor kBlockTensors[] = {
    {"ln_1.weight", 1, 0, false, Init::ones, &BlockPtrs::ln1w},
    {"ln_1.bias", 1, 0, false, Init::zeros, &BlockPtrs::ln1b},
    {"attn.c_attn.weight", 3, 1, true, Init::normal, &BlockPtrs::qkvw},  // q, k, v packed along the output
    {"attn.c_attn.bias", 3, 0, false, Init::zeros, &BlockPtrs::qkvb},
    {"attn.c_proj.weight", 1, 1, true, Init::residual_normal, &BlockPtrs::projw},
    {"attn.c_proj.bias", 1, 0, false, Init::zeros, &BlockPtrs::projb},
    {"ln_2.weight", 1, 0, false, Init::ones, &BlockPtrs::ln2w},
    {"ln_2.bias", 1, 0, false, Init::zeros, &BlockPtrs::ln2b},
    {"mlp.c_fc.weight", 4, 1, true, Init::normal, &BlockPtrs::fcw},
    {"mlp.c_fc.bias", 4, 0, false, Init::zeros, &BlockPtrs::fcb},
    {"mlp.c_proj.weight", 1, 4, true, Init::residual_normal, &BlockPtrs::fcprojw},
    {"mlp.c_proj.bias", 1, 0, false, Init::zeros, &BlockPtrs::fcprojb},
};

inline std::vector<int> shape_of(const BlockTensor& t, int C) {
  return t.cols ? std::vector<int>{t.rows * C, t.cols * C} : std::vector<int>{t.rows * C};
}
inline size_t size_of(const BlockTensor& t, size_t C) { return t.rows * C * (t.cols ? t.cols * C : 1); }

// The global name of a block tensor: "h.3.attn.c_attn.weight".
inline std::string block_tensor_name(int block, const BlockTensor& t) {
  return "h." + std::to_string(block) + "." + t.name;
}

// A block's pointers, its tensors laid out one after another from `first` (the stage's buffers).
inline BlockPtrs block_ptrs_from(float* first, size_t C) {
  BlockPtrs b;
  for (const BlockTensor& t : kBlockTensors) {
    b.*t.field = first;
    first += size_of(t, C);
  }
  return b;
}

}  // namespace pipetrain
