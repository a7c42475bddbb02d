#pragma once
// Where a rank's compute time goes, by kernel class. Always on: two clock reads per kernel call,
// microseconds per step. Timers run on the rank's main thread only (parallel_for chunks inside a
// timed kernel count toward that kernel); a timer started inside another counts nothing, so no
// time is counted twice. Reported per step in metrics.jsonl as kernel_s.
#include <array>

#include "pipetrain/config/choices.hpp"

namespace pipetrain {

// memory: sizing, zeroing and copying activation and gradient buffers; input: a micro-batch's
// tokens and targets, read from the dataset and placed in the stage.
// tp_comm: the tensor group's collectives inside the layers (their time, waiting included, counts
// here and not as a pipeline wait). norm and activation are named by the model family (LayerNorm
// and GELU, or RMSNorm and SwiGLU); rope, the rotary positions, is the llama family's alone.
// routing: a mixture of experts' router softmax, top-k, permutation and combine (moe_kernels.hpp);
// ep_comm: its all-to-alls over the expert-parallel group (parallel.ep), waiting included.
enum class Kernel {
  gemm,
  attention,
  norm,
  activation,
  rope,
  softmax,
  elementwise,
  optimizer,
  memory,
  input,
  tp_comm,
  routing,
  ep_comm
};
constexpr int kKernelClasses = 13;
const char* kernel_name(Kernel k, Arch arch);  // "gemm", "attention", "layernorm" or "rmsnorm", ...
// false for the classes the family's layers never run (routing, ep_comm: a model without experts)
bool kernel_in_family(Kernel k, Arch arch, bool moe);

struct KernelTotals {
  std::array<double, kKernelClasses> seconds{};
  double gemm_flops = 0;  // dense matrix products only (attention's small GEMMs count as attention)
  // Attention's scores and weighted sums over the whole T x T square (the causal mask not halving
  // them, as MFU counts them): 4 B T^2 C forward, twice that backward. Counted by the CPU kernels.
  double attention_flops = 0;
};

// Returns the totals since the last call and starts counting again.
KernelTotals take_kernel_totals();

void count_gemm_flops(double flops);
void count_attention_flops(double flops);

class KernelTimer {
 public:
  explicit KernelTimer(Kernel k);
  ~KernelTimer();
  KernelTimer(const KernelTimer&) = delete;
  KernelTimer& operator=(const KernelTimer&) = delete;

 private:
  Kernel kernel_;
  bool outermost_;
  double start_;
};

}  // namespace pipetrain
