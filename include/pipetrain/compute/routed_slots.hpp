// Where a mixture of experts' routing sends each token (moe_kernels.hpp's MoeRouting made it), as
// the MoE layer kernels read it: plain pointers, to host memory for the CPU's kernels and to device
// memory for the GPU's (RoutedSlotsCopy puts them there).
#pragma once

namespace pipetrain {

struct RoutedSlots {
  int N = 0, k = 0, E = 0;        // tokens, slots per token, experts
  int rows = 0;                   // the slots kept, laid out expert after expert
  const int* expert = nullptr;    // [N, k] each slot's expert
  const float* weight = nullptr;  // [N, k] its weight in the combine
  const int* row = nullptr;       // [N, k] its row among the experts' rows; -1 where capacity dropped it
  const int* token = nullptr;     // [rows] each row's token
  const int* chosen = nullptr;    // [E] slots choosing e, kept or dropped
};

}  // namespace pipetrain
