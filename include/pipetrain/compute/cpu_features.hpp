#pragma once
// What this CPU can compute, read from the processor itself (cpuid), not from a model-number table
// that new CPUs outrun: its vector instruction sets, and from them its fp32 FLOPs per cycle; its
// clock, nominal where the system says it and measured where it does not.
#include <string>

#include "pipetrain/config/choices.hpp"  // Dtype

namespace pipetrain {

// The widest vector instruction set the CPU and the operating system both support, in the order
// OpenBLAS's kernel families need them.
enum class SimdLevel { unknown = 0, sse3 = 1, avx = 2, avx2 = 3, avx512 = 4 };
const char* name_of(SimdLevel level);  // "SSE3", "AVX", "AVX2", "AVX-512"

struct CpuFeatures {
  std::string vendor;      // "GenuineIntel", "AuthenticAMD", "" off x86
  std::string model_name;  // the brand string, e.g. "AMD EPYC"
  int family = 0, model = 0;
  SimdLevel level = SimdLevel::unknown;
  double nominal_ghz = 0;  // the maximum clock the system states (cpufreq, cpuid 0x16, brand string); 0 if none does

  // fp32 FLOPs one core retires per cycle with `level`'s widest fused multiply-add: 2 FLOPs x lanes
  // x FMA pipes. The pipes come from the vendor and family where they differ (AMD's Zen 4 runs
  // AVX-512 on 256-bit halves, Zen 1 AVX2 on 128-bit ones); otherwise the server parts' two.
  int fp32_flops_per_cycle() const;

  bool avx512_bf16 = false;  // AVX-512's bf16 dot products (AMD Zen 4 and 5, Intel Cooper Lake, Sapphire Rapids)
  bool amx_bf16 = false;     // AMX's bf16 tile products (Intel Sapphire Rapids and later), usable by this OS
  // bf16 FLOPs per cycle with fp32 accumulation: AMX's 1024; AVX512_BF16's dot products twice the
  // fp32 rate; without either, bf16 products run on the fp32 units (emulated): the fp32 rate.
  int bf16_flops_per_cycle() const;
};

// This machine's CPU (the first core's cpuid: the cores of one node are alike).
const CpuFeatures& cpu_features();

// The clock a core runs at now, in GHz: the best of five ~10 ms chains of dependent additions
// (one cycle each), so a trial the scheduler interrupted does not count. 0 off x86.
double measure_clock_ghz();

// One core's peak for products of `dtype`, MFU's hardware denominator: FLOPs per cycle x clock. The clock is the
// higher of the stated maximum and the one measured now: virtual machines state none, and a base
// clock understates what turbo runs at.
struct CorePeak {
  double gflops = 0, clock_ghz = 0;
  int flops_per_cycle = 0;
  bool clock_measured = false;
  std::string basis;  // "AVX-512: 64 FLOP/cycle x 3.44 GHz (measured)"
};
CorePeak core_peak(Dtype dtype = Dtype::fp32);  // dtype: the matrix products' operands (model.dtype)

}  // namespace pipetrain
