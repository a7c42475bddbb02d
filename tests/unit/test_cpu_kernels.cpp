// What the CPU runs (cpuid, against the kernel's own reading in /proc/cpuinfo), its peak, and the
// choice of OpenBLAS kernels: the policy on made-up situations, the reference product on this
// machine's kernels.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <set>
#include <sstream>

#include "pipetrain/compute/blas_kernels.hpp"
#include "pipetrain/compute/cpu_features.hpp"

using namespace pipetrain;

namespace {

// The flags Linux read from cpuid for the first core (and cleared where the OS does not save the state).
std::set<std::string> linux_cpu_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::set<std::string> flags;
  for (std::string line; std::getline(in, line);)
    if (line.rfind("flags", 0) == 0) {
      std::istringstream words(line.substr(line.find(':') + 1));
      for (std::string w; words >> w;) flags.insert(w);
      break;
    }
  return flags;
}

#if defined(__x86_64__)
// The clock an independent way: a chain of dependent 64-bit multiplies, 3 cycles each on every
// x86-64 core of the last fifteen years, which no core folds or eliminates.
double clock_by_multiplies_ghz() {
  constexpr uint64_t rounds = 1 << 21;
  double best = 0;
  for (int trial = 0; trial < 5; ++trial) {
    uint64_t x = 1, one = 1;
    const auto t0 = std::chrono::steady_clock::now();
    for (uint64_t i = 0; i < rounds; ++i)
      __asm__ volatile("imul %1, %0\n\timul %1, %0\n\timul %1, %0\n\timul %1, %0" : "+r"(x) : "r"(one));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, rounds * 4 * 3 / s / 1e9);
  }
  return best;
}
#endif

CpuFeatures cpu(const char* vendor, int family, int model, SimdLevel level) {
  CpuFeatures f;
  f.vendor = vendor;
  f.family = family;
  f.model = model;
  f.level = level;
  return f;
}

KernelSituation situation(SimdLevel cpu, const char* running) {
  KernelSituation s;
  s.cpu = cpu;
  s.running = running;
  return s;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("cpuid's instruction sets agree with the flags the kernel read") {
  const std::set<std::string> f = linux_cpu_flags();
  REQUIRE(!f.empty());
  auto has = [&](std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (!f.count(n)) return false;
    return true;
  };
  const SimdLevel want = has({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx2", "fma"})
                             ? SimdLevel::avx512
                         : has({"avx2", "fma"}) ? SimdLevel::avx2
                         : has({"avx"})         ? SimdLevel::avx
                         : has({"pni"})         ? SimdLevel::sse3
                                                : SimdLevel::unknown;
  CHECK(std::string(name_of(cpu_features().level)) == name_of(want));
  CHECK(!cpu_features().vendor.empty());
  CHECK(cpu_features().avx512_bf16 == (want == SimdLevel::avx512 && has({"avx512_bf16"})));
  CHECK(cpu_features().amx_bf16 == (want == SimdLevel::avx512 && has({"amx_bf16", "amx_tile"})));
}

TEST_CASE("bf16 FLOPs per cycle: AMX's tiles, AVX512_BF16's twice fp32, else fp32's (emulated)") {
  CpuFeatures zen4 = cpu("AuthenticAMD", 0x19, 0x11, SimdLevel::avx512);
  CHECK(zen4.bf16_flops_per_cycle() == 32);  // no bf16 units: the fp32 rate
  zen4.avx512_bf16 = true;
  CHECK(zen4.bf16_flops_per_cycle() == 64);
  CpuFeatures sapphire = cpu("GenuineIntel", 6, 0x8f, SimdLevel::avx512);
  sapphire.avx512_bf16 = sapphire.amx_bf16 = true;
  CHECK(sapphire.bf16_flops_per_cycle() == 1024);
  const CorePeak peak = core_peak(Dtype::bf16);
  CHECK(peak.flops_per_cycle == cpu_features().bf16_flops_per_cycle());
  CHECK(contains(peak.basis, std::to_string(peak.flops_per_cycle) + " FLOP/cycle"));
}

TEST_CASE("fp32 FLOPs per cycle: lanes x 2 x FMA pipes, by instruction set and, where pipes differ, family") {
  CHECK(cpu("GenuineIntel", 6, 0xcf, SimdLevel::avx512).fp32_flops_per_cycle() == 64);     // 2 x 16 lanes x 2 pipes
  CHECK(cpu("AuthenticAMD", 0x19, 0x11, SimdLevel::avx512).fp32_flops_per_cycle() == 32);  // Zen 4: 256-bit pipes
  CHECK(cpu("AuthenticAMD", 0x1a, 0x02, SimdLevel::avx512).fp32_flops_per_cycle() == 64);  // Zen 5
  CHECK(cpu("GenuineIntel", 6, 0x3f, SimdLevel::avx2).fp32_flops_per_cycle() == 32);
  CHECK(cpu("AuthenticAMD", 0x17, 0x01, SimdLevel::avx2).fp32_flops_per_cycle() == 16);  // Zen 1: 128-bit pipes
  CHECK(cpu("AuthenticAMD", 0x17, 0x31, SimdLevel::avx2).fp32_flops_per_cycle() == 32);  // Zen 2
  CHECK(cpu("GenuineIntel", 6, 0x2a, SimdLevel::avx).fp32_flops_per_cycle() == 16);
  CHECK(cpu("GenuineIntel", 6, 0x0f, SimdLevel::sse3).fp32_flops_per_cycle() == 8);
}

TEST_CASE("a core's peak is its FLOPs per cycle times a clock no lower than the measured or stated one") {
  const double clock = measure_clock_ghz();
  const CorePeak peak = core_peak();
#if defined(__x86_64__)
  CHECK(clock > 0.5);
  CHECK(clock < 8.0);
  // Within 15%: the two chains run back to back, and the clock may move between them.
  CHECK(clock == Approx(clock_by_multiplies_ghz()).epsilon(0.15));
#endif
  CHECK(peak.flops_per_cycle == cpu_features().fp32_flops_per_cycle());
  CHECK(peak.clock_ghz >= cpu_features().nominal_ghz);
  CHECK(peak.gflops == Approx(peak.flops_per_cycle * peak.clock_ghz));
  CHECK(contains(peak.basis, std::to_string(peak.flops_per_cycle) + " FLOP/cycle"));
}

TEST_CASE("kernel families map to the instruction sets they need, and back") {
  CHECK(level_of_kernels("Prescott") == SimdLevel::sse3);
  CHECK(level_of_kernels("Sandybridge") == SimdLevel::avx);
  CHECK(level_of_kernels("Zen") == SimdLevel::avx2);
  CHECK(level_of_kernels("Cooperlake") == SimdLevel::avx512);
  CHECK(level_of_kernels("NEOVERSEN1") == SimdLevel::unknown);
  for (SimdLevel l : {SimdLevel::sse3, SimdLevel::avx, SimdLevel::avx2, SimdLevel::avx512})
    CHECK(level_of_kernels(kernels_for(l)) == l);
}

TEST_CASE("OpenBLAS's fallback below the CPU is replaced by the CPU's kernels, and the restart says so") {
  KernelSituation first = situation(SimdLevel::avx512, "Prescott");
  KernelDecision d = decide_kernels(first);
  CHECK(d.action == KernelDecision::restart);
  CHECK(d.family == "SkylakeX");

  KernelSituation restarted = situation(SimdLevel::avx512, "SkylakeX");
  restarted.openblas_chose = "Prescott";
  d = decide_kernels(restarted);
  CHECK(d.action == KernelDecision::keep);
  CHECK(d.note == "OpenBLAS chose Prescott on an AVX-512 CPU; using SkylakeX kernels");
  CHECK_FALSE(d.below_cpu);

  // An OpenBLAS built for one CPU type ignores OPENBLAS_CORETYPE: no loop, and it is said.
  KernelSituation ignored = situation(SimdLevel::avx512, "Prescott");
  ignored.openblas_chose = "Prescott";
  d = decide_kernels(ignored);
  CHECK(d.action == KernelDecision::keep);
  CHECK(d.below_cpu);
  CHECK(contains(d.note, "changed nothing"));

  d = decide_kernels(situation(SimdLevel::avx512, "Cooperlake"));  // a right choice: nothing to do or say
  CHECK(d.action == KernelDecision::keep);
  CHECK(d.note.empty());
  CHECK(decide_kernels(situation(SimdLevel::avx2, "Zen")).action == KernelDecision::keep);
}

TEST_CASE("kernels that compute wrong products are never kept: the next family down is tried, then refused") {
  KernelSituation s = situation(SimdLevel::avx512, "SkylakeX");
  s.openblas_chose = "Prescott";
  s.wrong = "C[0,0] = 7 where the reference is 1";
  KernelDecision d = decide_kernels(s);
  CHECK(d.action == KernelDecision::restart);
  CHECK(d.family == "Haswell");
  CHECK(d.rejected ==
        std::vector<std::string>{"SkylakeX: C[0,0] = 7 where the reference is 1"});  // handed to the restart

  KernelSituation next = situation(SimdLevel::avx512, "Haswell");
  next.openblas_chose = "Prescott";
  next.rejected = {"SkylakeX: C[0,0] = 7 where the reference is 1"};
  d = decide_kernels(next);
  CHECK(d.action == KernelDecision::keep);
  CHECK(d.below_cpu);
  CHECK(contains(d.note, "using Haswell kernels (wrong products from SkylakeX: C[0,0] = 7"));

  // OpenBLAS's own choice computing wrong products falls back the same way.
  KernelSituation own = situation(SimdLevel::avx2, "Haswell");
  own.wrong = "sgemm NT gave NaN";
  d = decide_kernels(own);
  CHECK(d.action == KernelDecision::restart);
  CHECK(d.family == "Sandybridge");

  KernelSituation last = situation(SimdLevel::avx2, "Prescott");
  last.openblas_chose = "Haswell";
  last.rejected = {"Haswell: a", "Sandybridge: b"};
  last.wrong = "c";
  d = decide_kernels(last);
  CHECK(d.action == KernelDecision::refuse);
  CHECK(d.note == "no OpenBLAS kernels compute correct products on this CPU: Haswell: a; Sandybridge: b; Prescott: c");
}

TEST_CASE("OPENBLAS_CORETYPE or OPENBLAS_L2_SIZE from the environment always wins, and is named") {
  KernelSituation s = situation(SimdLevel::avx512, "Haswell");
  s.user_coretype = "Haswell";
  KernelDecision d = decide_kernels(s);
  CHECK(d.action == KernelDecision::keep);
  CHECK(d.user_chose);
  CHECK(d.below_cpu);
  CHECK(d.note ==
        "from OPENBLAS_CORETYPE=Haswell in the environment; this AVX-512 CPU runs SkylakeX kernels, but the "
        "environment wins");

  s.wrong = "C[1,2] = inf where the reference is 3";
  d = decide_kernels(s);
  CHECK(d.action == KernelDecision::refuse);
  CHECK(contains(d.note, "OPENBLAS_CORETYPE=Haswell"));
  CHECK(contains(d.note, "C[1,2] = inf"));

  KernelSituation l2 = situation(SimdLevel::avx512, "Prescott");
  l2.user_l2_size = "512";
  d = decide_kernels(l2);
  CHECK(d.action == KernelDecision::keep);
  CHECK(d.below_cpu);
  CHECK(contains(d.note, "OPENBLAS_L2_SIZE=512"));
}

TEST_CASE("this machine's kernels agree with the reference product") { CHECK(check_sgemm_against_reference() == ""); }
