#pragma once
// Which OpenBLAS kernels a process computes with. OpenBLAS picks its kernel family from a table of
// CPU model numbers; on a CPU newer than its table it falls back to Prescott's SSE3 kernels, a
// sixth of what an AVX-512 core does. pipetrain compares that choice with what cpuid says the CPU
// runs, and where OpenBLAS fell below it, restarts itself (before MPI) with OPENBLAS_CORETYPE set
// to the matching family. The kernels kept are checked once against a reference product: a family
// that computes wrong results on this CPU is never kept. An OPENBLAS_CORETYPE or OPENBLAS_L2_SIZE
// the user set always wins (some machines need them because older OpenBLAS builds misbehave there).
#include <string>
#include <vector>

#include "pipetrain/compute/cpu_features.hpp"

namespace pipetrain {

// The instruction set an OpenBLAS kernel family ("Haswell", "SkylakeX", ...) is written for.
SimdLevel level_of_kernels(const std::string& family);
// The family pipetrain asks for on a CPU of `level`: SkylakeX, Haswell, Sandybridge, Prescott.
const char* kernels_for(SimdLevel level);

// Everything the choice depends on, as one process start sees it.
struct KernelSituation {
  SimdLevel cpu = SimdLevel::unknown;
  std::string running;                // the family OpenBLAS runs now
  std::string user_coretype;          // OPENBLAS_CORETYPE as the user set it, "" if not
  std::string user_l2_size;           // OPENBLAS_L2_SIZE as the user set it, "" if not
  std::string openblas_chose;         // what OpenBLAS chose itself, when this process is pipetrain's restart
  std::vector<std::string> rejected;  // "Family: why" for each family found computing wrong products
  std::string wrong;                  // "" when the running kernels passed the reference product, else why not
};

struct KernelDecision {
  enum Action { keep, restart, refuse } action = keep;
  std::string family;                 // restart: the family to restart with
  std::vector<std::string> rejected;  // restart: the situation's rejected families, with the running one if it failed
  std::string note;         // keep: the start line's note ("" when there is nothing to say); refuse: the message
  bool below_cpu = false;   // keep: the kernels kept run below what the CPU runs
  bool user_chose = false;  // keep: the environment chose them
};

// The whole policy, without side effects (unit-tested on made-up situations).
KernelDecision decide_kernels(const KernelSituation& s);

// "" when cblas_sgemm agrees with a double-precision reference, on each transpose the layer kernels
// use, on shapes that reach the kernels' edge tiles and their blocking of K; else the worst entry.
std::string check_sgemm_against_reference();

// Settles the kernels of this process: may restart it (never returns then) and returns the exit
// code of a refusal, or 0 to go on. Called first thing by commands that compute, before MPI.
int settle_blas_kernels(char** argv);

// After settle_blas_kernels: what the start line and smoke say about the kernels.
const KernelDecision& blas_kernel_decision();

}  // namespace pipetrain
