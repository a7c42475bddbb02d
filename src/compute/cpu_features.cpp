#include "pipetrain/compute/cpu_features.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>

#include "pipetrain/util/clock.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define PIPETRAIN_X86 1
#endif

namespace pipetrain {

const char* name_of(SimdLevel level) {
  switch (level) {
    case SimdLevel::sse3:
      return "SSE3";
    case SimdLevel::avx:
      return "AVX";
    case SimdLevel::avx2:
      return "AVX2";
    case SimdLevel::avx512:
      return "AVX-512";
    default:
      return "unknown";
  }
}

int CpuFeatures::fp32_flops_per_cycle() const {
  const bool amd = vendor == "AuthenticAMD";
  switch (level) {
    case SimdLevel::avx512:
      return amd && family == 0x19 ? 32 : 64;  // Zen 4: 512-bit ops on 256-bit pipes
    case SimdLevel::avx2:
      if (amd && (family < 0x17 || (family == 0x17 && model < 0x30))) return 16;  // Zen 1 / Zen+: 128-bit pipes
      return 32;
    case SimdLevel::avx:
      return 16;  // an 8-wide multiply and an 8-wide add per cycle, no FMA
    case SimdLevel::sse3:
      return 8;
    default:
      return 0;
  }
}

int CpuFeatures::bf16_flops_per_cycle() const {
  if (amx_bf16) return 1024;  // a tile multiply-add: 16 x 16 x 32 bf16 products in 16 cycles
  // VDPBF16PS does two bf16 products per fp32 lane where an FMA does one, at the FMA's rate
  return avx512_bf16 ? 2 * fp32_flops_per_cycle() : fp32_flops_per_cycle();
}

namespace {

#ifdef PIPETRAIN_X86
struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned sub = 0) {
  Regs r;
  __cpuid_count(leaf, sub, r.a, r.b, r.c, r.d);
  return r;
}

// The register state the operating system saves on a context switch (XCR0): a vector unit the OS
// does not save cannot be used, whatever cpuid says.
uint64_t os_saved_state() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

SimdLevel simd_level(unsigned max_leaf) {
  const Regs one = cpuid(1);
  const bool sse3 = one.c & bit_SSE3, fma = one.c & bit_FMA, osxsave = one.c & bit_OSXSAVE, avx_bit = one.c & bit_AVX;
  if (!sse3) return SimdLevel::unknown;
  const uint64_t xcr0 = osxsave ? os_saved_state() : 0;
  const bool ymm = (xcr0 & 0x6) == 0x6, zmm = (xcr0 & 0xe6) == 0xe6;  // SSE+AVX state; + opmask and ZMM state
  if (!avx_bit || !ymm) return SimdLevel::sse3;
  const Regs seven = max_leaf >= 7 ? cpuid(7, 0) : Regs{};
  const bool avx2 = seven.b & bit_AVX2;
  // OpenBLAS's AVX-512 kernels (SkylakeX) use the F, CD, BW, DQ and VL subsets.
  const unsigned avx512_subsets = bit_AVX512F | bit_AVX512CD | bit_AVX512BW | bit_AVX512DQ | bit_AVX512VL;
  if (avx2 && fma && zmm && (seven.b & avx512_subsets) == avx512_subsets) return SimdLevel::avx512;
  if (avx2 && fma) return SimdLevel::avx2;
  return SimdLevel::avx;
}

// bf16 dot products: AVX512_BF16 (cpuid 7.1 EAX bit 5) on an AVX-512 CPU; AMX's bf16 tiles (7.0
// EDX bits 22 and 24) where the OS saves the tile state too (XCR0 bits 17 and 18).
void read_bf16_units(CpuFeatures& f, unsigned max_leaf) {
  if (f.level != SimdLevel::avx512 || max_leaf < 7) return;
  const Regs seven = cpuid(7, 0);
  f.avx512_bf16 = seven.a >= 1 && (cpuid(7, 1).a & (1u << 5));
  const bool tiles = (seven.d & (1u << 22)) && (seven.d & (1u << 24));
  f.amx_bf16 = tiles && (os_saved_state() & (3u << 17)) == (3u << 17);
}

std::string brand_string() {
  if (cpuid(0x80000000).a < 0x80000004) return "";
  char text[49] = {};
  for (unsigned i = 0; i < 3; ++i) {
    const Regs r = cpuid(0x80000002 + i);
    std::memcpy(text + 16 * i, &r, 16);
  }
  std::string s(text);
  s.erase(0, s.find_first_not_of(' '));
  s.erase(s.find_last_not_of(' ') + 1);
  return s;
}
#endif

// The maximum clock the system states, in GHz: cpufreq's, else cpuid's frequency leaf (Intel),
// else the "@ 2.10GHz" of an Intel brand string; 0 where none says (virtual machines hide cpufreq,
// AMD states no frequency in cpuid).
double stated_max_ghz([[maybe_unused]] unsigned max_leaf, const std::string& brand) {
  long khz = 0;
  if (std::ifstream("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq") >> khz && khz > 0) return khz / 1e6;
#ifdef PIPETRAIN_X86
  if (max_leaf >= 0x16 && (cpuid(0x16).b & 0xffff) > 0) return (cpuid(0x16).b & 0xffff) / 1e3;
#endif
  std::smatch m;
  if (std::regex_search(brand, m, std::regex(R"(@\s*([0-9.]+)\s*GHz)"))) return std::atof(m[1].str().c_str());
  return 0;
}

CpuFeatures read_cpu_features() {
  CpuFeatures f;
  unsigned max_leaf = 0;
#ifdef PIPETRAIN_X86
  const Regs zero = cpuid(0);
  max_leaf = zero.a;
  char vendor[13] = {};
  std::memcpy(vendor, &zero.b, 4);
  std::memcpy(vendor + 4, &zero.d, 4);
  std::memcpy(vendor + 8, &zero.c, 4);
  f.vendor = vendor;
  const unsigned eax = cpuid(1).a, base_family = (eax >> 8) & 0xf, base_model = (eax >> 4) & 0xf;
  f.family = static_cast<int>(base_family == 0xf ? base_family + ((eax >> 20) & 0xff) : base_family);
  f.model =
      static_cast<int>(base_family == 0x6 || base_family == 0xf ? base_model | (((eax >> 16) & 0xf) << 4) : base_model);
  f.level = simd_level(max_leaf);
  read_bf16_units(f, max_leaf);
  f.model_name = brand_string();
#endif
  f.nominal_ghz = stated_max_ghz(max_leaf, f.model_name);
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = read_cpu_features();
  return features;
}

namespace {

const char* units_text(const CpuFeatures& cpu, Dtype dtype) {
  if (dtype == Dtype::fp32) return name_of(cpu.level);
  if (cpu.amx_bf16) return "AMX bf16";
  if (cpu.avx512_bf16) return "AVX512_BF16";
  return cpu.level == SimdLevel::avx512 ? "AVX-512, bf16 emulated" : name_of(cpu.level);
}

}  // namespace

double measure_clock_ghz() {
#ifdef PIPETRAIN_X86
  constexpr uint64_t rounds = 1 << 22, adds_per_round = 8;  // 33M cycles: ~10 ms at 3 GHz
  double best = 0;
  for (int trial = 0; trial < 5; ++trial) {
    uint64_t x = 0, one = 1;
    const double t0 = now_s();
    // Each add waits for the one before: one per cycle. The addend is a register, not an immediate:
    // Intel cores since Golden Cove fold chains of immediate adds at rename, several per cycle.
    for (uint64_t i = 0; i < rounds; ++i)
      __asm__ volatile(
          "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
          "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0"
          : "+r"(x)
          : "r"(one));
    best = std::max(best, static_cast<double>(rounds * adds_per_round) / (now_s() - t0) / 1e9);
  }
  return best;
#else
  return 0;
#endif
}

CorePeak core_peak(Dtype dtype) {
  const CpuFeatures& cpu = cpu_features();
  CorePeak peak;
  peak.flops_per_cycle = dtype == Dtype::bf16 ? cpu.bf16_flops_per_cycle() : cpu.fp32_flops_per_cycle();
  const double measured = measure_clock_ghz();
  peak.clock_measured = measured > cpu.nominal_ghz;
  peak.clock_ghz = std::max(measured, cpu.nominal_ghz);
  peak.gflops = peak.flops_per_cycle * peak.clock_ghz;
  char text[128];
  std::snprintf(text, sizeof text, "%s: %d FLOP/cycle x %.2f GHz (%s)", units_text(cpu, dtype), peak.flops_per_cycle,
                peak.clock_ghz, peak.clock_measured ? "measured" : "stated");
  peak.basis = text;
  return peak;
}

}  // namespace pipetrain
