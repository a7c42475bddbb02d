#include "pipetrain/compute/profile.hpp"

#include "pipetrain/util/clock.hpp"

namespace pipetrain {
namespace {
// Per thread: each rank's main thread times its own kernels (two ranks may share a process in tests).
thread_local KernelTotals totals;
thread_local bool timing = false;  // a KernelTimer runs
}  // namespace

const char* kernel_name(Kernel k, Arch arch) {
  const bool llama = arch == Arch::llama;
  if (k == Kernel::norm) return llama ? "rmsnorm" : "layernorm";
  if (k == Kernel::activation) return llama ? "swiglu" : "gelu";
  static const char* names[kKernelClasses] = {"gemm",    "attention",   "",          "",       "rope",
                                              "softmax", "elementwise", "optimizer", "memory", "input",
                                              "tp_comm", "routing",     "ep_comm"};
  return names[static_cast<int>(k)];
}

bool kernel_in_family(Kernel k, Arch arch, bool moe) {
  if (k == Kernel::routing || k == Kernel::ep_comm) return moe;
  return k != Kernel::rope || arch == Arch::llama;
}

KernelTotals take_kernel_totals() {
  KernelTotals t = totals;
  totals = KernelTotals{};
  return t;
}

void count_gemm_flops(double flops) { totals.gemm_flops += flops; }
void count_attention_flops(double flops) { totals.attention_flops += flops; }

KernelTimer::KernelTimer(Kernel k) : kernel_(k), outermost_(!timing), start_(now_s()) { timing = true; }
KernelTimer::~KernelTimer() {
  if (!outermost_) return;
  totals.seconds[static_cast<int>(kernel_)] += now_s() - start_;
  timing = false;
}

}  // namespace pipetrain
