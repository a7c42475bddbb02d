// How pipetrain's parameters (design.md "Model and parameter names": PyTorch nn.Linear layout,
// [out, in]) appear in the two outside formats, derived from the one table of a block's tensors
// (kGpt2Block) so that a tensor added there is mapped here too.
//
// Hugging Face GPT-2: the same names under "transformer." (the head is "lm_head.weight", and only
// untied models store it), and the block matrices in Conv1D layout, [in, out]: transposed.
// llm.c: no names; the tensors one after another in a fixed order, each kind of block tensor for
// all layers together, matrices [out, in] like ours, the token table padded to a multiple of 128 rows.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace pipetrain {

// "transformer.h.3.attn.c_attn.weight" for "h.3.attn.c_attn.weight"; "lm_head.weight" stays.
std::string hf_name(const std::string& name);
// The pipetrain name of a Hugging Face one, with or without the "transformer." prefix (GPT2Model
// saves without it); "" when it is not a GPT-2 parameter name.
std::string name_from_hf(const std::string& hf);
// Whether Hugging Face stores this tensor as Conv1D ([in, out]): the block's 2-D weights.
bool hf_transposed(const std::string& name);

// [rows, cols] -> [cols, rows] of a row-major matrix.
void transpose(const float* in, int64_t rows, int64_t cols, float* out);

// pipetrain names in llm.c's file order for an L-block model: wte, wpe, then per block tensor kind
// all L blocks (ln_1.weight of h.0 .. h.L-1, then ln_1.bias, ...), then ln_f.weight, ln_f.bias.
std::vector<std::string> llmc_order(int n_layer);

// The block index and the tensor's name within the block of "h.{i}.<tensor>"; false for others.
bool split_block_name(const std::string& name, int* block, std::string* tensor);

}  // namespace pipetrain
