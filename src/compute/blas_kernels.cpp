#include "pipetrain/compute/blas_kernels.hpp"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "pipetrain/compute/blas.hpp"
#include "pipetrain/util/errors.hpp"

namespace pipetrain {

SimdLevel level_of_kernels(const std::string& family) {
  for (const char* f : {"SkylakeX", "Cooperlake", "SapphireRapids"})
    if (family == f) return SimdLevel::avx512;
  for (const char* f : {"Haswell", "Zen"})
    if (family == f) return SimdLevel::avx2;
  for (const char* f : {"Sandybridge", "Bulldozer", "Piledriver", "Steamroller", "Excavator"})
    if (family == f) return SimdLevel::avx;
  for (const char* f :
       {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Opteron_SSE3", "Barcelona", "Bobcat", "Nano"})
    if (family == f) return SimdLevel::sse3;
  return SimdLevel::unknown;  // another architecture's kernels, or a family this table does not know
}

const char* kernels_for(SimdLevel level) {
  switch (level) {
    case SimdLevel::avx512:
      return "SkylakeX";
    case SimdLevel::avx2:
      return "Haswell";
    case SimdLevel::avx:
      return "Sandybridge";
    default:
      return "Prescott";
  }
}

namespace {

std::string cpu_text(SimdLevel cpu) { return std::string("an ") + name_of(cpu) + " CPU"; }

// The best family below `level` not yet found computing wrong products; "" if none is left.
std::string next_below(SimdLevel level, const std::vector<std::string>& rejected) {
  for (int l = static_cast<int>(level) - 1; l >= static_cast<int>(SimdLevel::sse3); --l) {
    const std::string family = kernels_for(static_cast<SimdLevel>(l));
    const bool bad = std::any_of(rejected.begin(), rejected.end(),
                                 [&](const std::string& r) { return r.rfind(family + ":", 0) == 0; });
    if (!bad) return family;
  }
  return "";
}

std::string joined(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : "; ") + p;
  return out;
}

// Falls back below kernels that computed wrong products, or refuses when none are left.
KernelDecision fall_back(const KernelSituation& s) {
  KernelDecision d;
  d.rejected = s.rejected;
  d.rejected.push_back(s.running + ": " + s.wrong);
  d.family = next_below(level_of_kernels(s.running), d.rejected);
  if (d.family.empty()) {
    d.action = KernelDecision::refuse;
    d.note = "no OpenBLAS kernels compute correct products on this CPU: " + joined(d.rejected);
  } else {
    d.action = KernelDecision::restart;
  }
  return d;
}

}  // namespace

KernelDecision decide_kernels(const KernelSituation& s) {
  KernelDecision d;
  const SimdLevel running = level_of_kernels(s.running);
  d.below_cpu = running != SimdLevel::unknown && running < s.cpu;
  const std::string better = d.below_cpu ? "; this " + std::string(name_of(s.cpu)) + " CPU runs " + kernels_for(s.cpu) +
                                               " kernels, but the environment wins"
                                         : "";
  if (s.openblas_chose.empty() && !s.user_coretype.empty()) {  // the user's choice
    d.user_chose = true;
    if (!s.wrong.empty()) {
      d.action = KernelDecision::refuse;
      d.note = "OpenBLAS " + s.running + " kernels, chosen by OPENBLAS_CORETYPE=" + s.user_coretype +
               " in the environment, compute wrong products on this CPU (" + s.wrong +
               "): unset OPENBLAS_CORETYPE or name another kernel family";
      return d;
    }
    d.note = "from OPENBLAS_CORETYPE=" + s.user_coretype + " in the environment" + better;
    return d;
  }
  if (s.openblas_chose.empty() && !s.user_l2_size.empty()) {  // set for OpenBLAS's own detection: leave it to it
    d.user_chose = true;
    if (!s.wrong.empty()) {
      d.action = KernelDecision::refuse;
      d.note = "OpenBLAS " + s.running + " kernels compute wrong products on this CPU (" + s.wrong +
               "); OPENBLAS_L2_SIZE=" + s.user_l2_size +
               " is set in the environment, so pipetrain chooses no others: "
               "set OPENBLAS_CORETYPE to a kernel family that works here";
      return d;
    }
    d.note = "OpenBLAS's own choice under OPENBLAS_L2_SIZE=" + s.user_l2_size + " from the environment" + better;
    return d;
  }
  if (!s.wrong.empty()) return fall_back(s);
  if (s.openblas_chose.empty()) {  // the first start: OpenBLAS chose
    if (d.below_cpu) {
      d.action = KernelDecision::restart;
      d.family = kernels_for(s.cpu);
      d.rejected = s.rejected;
    }
    return d;
  }
  // pipetrain's restart: say what OpenBLAS chose and what runs instead.
  d.note = "OpenBLAS chose " + s.openblas_chose + " on " + cpu_text(s.cpu);
  if (s.running == s.openblas_chose)
    d.note += "; asking for other kernels changed nothing (an OpenBLAS built for one CPU type?)";
  else d.note += "; using " + s.running + " kernels";
  if (!s.rejected.empty()) d.note += " (wrong products from " + joined(s.rejected) + ")";
  return d;
}

std::string check_sgemm_against_reference() {
  struct Shape {
    CBLAS_TRANSPOSE ta, tb;
    int m, n, k;
    float beta;
  };
  // The transposes of matmul_forward (N,T), its input gradient (N,N) and its weight gradient (T,N,
  // accumulating). Odd sizes reach the micro-kernel's edge tiles; k = 320 crosses OpenBLAS's
  // K blocking on every family.
  const Shape shapes[] = {
      {CblasNoTrans, CblasTrans, 67, 61, 259, 0.f},     {CblasNoTrans, CblasNoTrans, 67, 61, 259, 0.f},
      {CblasTrans, CblasNoTrans, 67, 61, 259, 1.f},     {CblasNoTrans, CblasTrans, 256, 768, 320, 0.f},
      {CblasNoTrans, CblasNoTrans, 256, 768, 320, 0.f}, {CblasTrans, CblasNoTrans, 256, 768, 320, 1.f}};
  uint64_t seed = 0x9e3779b97f4a7c15ull;
  auto uniform = [&seed] {  // xorshift: values in [-1, 1)
    seed ^= seed << 13;
    seed ^= seed >> 7;
    seed ^= seed << 17;
    return static_cast<float>(seed >> 40) / static_cast<float>(1 << 23) - 1.f;
  };
  const int threads = openblas_get_num_threads();
  openblas_set_num_threads(1);  // the same kernels as with more threads, without starting them
  std::string worst;
  double worst_ratio = 1;
  for (const Shape& s : shapes) {
    std::vector<float> a(static_cast<size_t>(s.m) * s.k), b(static_cast<size_t>(s.k) * s.n),
        c(static_cast<size_t>(s.m) * s.n);
    for (float& x : a) x = uniform();
    for (float& x : b) x = uniform();
    for (float& x : c) x = uniform();
    const std::vector<float> c0 = c;
    const int lda = s.ta == CblasNoTrans ? s.k : s.m, ldb = s.tb == CblasNoTrans ? s.n : s.k;
    cblas_sgemm(CblasRowMajor, s.ta, s.tb, s.m, s.n, s.k, 1.f, a.data(), lda, b.data(), ldb, s.beta, c.data(), s.n);
    auto A = [&](int i, int p) {
      return s.ta == CblasNoTrans ? a[static_cast<size_t>(i) * lda + p] : a[static_cast<size_t>(p) * lda + i];
    };
    auto B = [&](int p, int j) {
      return s.tb == CblasNoTrans ? b[static_cast<size_t>(p) * ldb + j] : b[static_cast<size_t>(j) * ldb + p];
    };
    // Every entry of small products; of large ones, the edge rows and columns and a stride through the rest.
    const int step = s.m * s.n > 10000 ? 37 : 1;
    for (int i = 0; i < s.m; ++i)
      for (int j = 0; j < s.n; ++j) {
        if (step > 1 && (i * s.n + j) % step != 0 && i != 0 && i != s.m - 1 && j != 0 && j != s.n - 1) continue;
        double ref = s.beta * c0[static_cast<size_t>(i) * s.n + j], magnitude = std::fabs(ref);
        for (int p = 0; p < s.k; ++p) {
          ref += static_cast<double>(A(i, p)) * B(p, j);
          magnitude += std::fabs(A(i, p) * B(p, j));
        }
        // fp32 sums of k terms in any order stay within k x 2^-24 of the magnitude summed.
        const double got = c[static_cast<size_t>(i) * s.n + j],
                     bound = 2.0 * (s.k + 1) * std::ldexp(magnitude, -24) + 1e-30;
        const double ratio = std::isfinite(got) ? std::fabs(got - ref) / bound : INFINITY;
        if (ratio > worst_ratio) {
          worst_ratio = ratio;
          std::ostringstream text;
          text << "sgemm " << (s.ta == CblasNoTrans ? "N" : "T") << (s.tb == CblasNoTrans ? "N" : "T") << " " << s.m
               << "x" << s.n << "x" << s.k << " gave C[" << i << "," << j << "] = " << got << " where the reference is "
               << ref;
          worst = text.str();
        }
      }
  }
  openblas_set_num_threads(threads);
  return worst;
}

namespace {

KernelDecision settled;

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string p; std::getline(in, p, sep);)
    if (!p.empty()) parts.push_back(p);
  return parts;
}

// What pipetrain hands its restart: what OpenBLAS chose itself and the families already rejected.
constexpr const char* kChoseVar = "PIPETRAIN_OPENBLAS_CHOSE";
constexpr const char* kRejectedVar = "PIPETRAIN_OPENBLAS_REJECTED";

}  // namespace

int settle_blas_kernels(char** argv) {
  KernelSituation s;
  s.cpu = cpu_features().level;
  s.running = blas_kernel_family();
  s.openblas_chose = env_or_empty(kChoseVar);
  if (s.openblas_chose.empty()) {
    s.user_coretype = env_or_empty("OPENBLAS_CORETYPE");
    s.user_l2_size = env_or_empty("OPENBLAS_L2_SIZE");
  }
  s.rejected = split(env_or_empty(kRejectedVar), '\n');
  s.wrong = check_sgemm_against_reference();
  settled = decide_kernels(s);
  if (settled.action == KernelDecision::refuse) {
    if (settled.user_chose) report_error(settled.note);
    else report_fault(settled.note);
    return code(settled.user_chose ? ExitCode::bad_input : ExitCode::fault);
  }
  if (settled.action == KernelDecision::keep) return 0;
  std::string rejected;
  for (const std::string& r : settled.rejected) rejected += r + "\n";
  setenv(kChoseVar, s.openblas_chose.empty() ? s.running.c_str() : s.openblas_chose.c_str(), 1);
  setenv(kRejectedVar, rejected.c_str(), 1);
  setenv("OPENBLAS_CORETYPE", settled.family.c_str(), 1);
  execv("/proc/self/exe", argv);  // OpenBLAS reads OPENBLAS_CORETYPE only as it loads
  const std::string failed =
      "restarting with OpenBLAS " + settled.family + " kernels failed (" + std::strerror(errno) + ")";
  if (!s.wrong.empty()) {  // never go on with kernels that compute wrong products
    report_fault("OpenBLAS " + s.running + " kernels compute wrong products on this CPU (" + s.wrong + "); " + failed);
    return code(ExitCode::fault);
  }
  settled = KernelDecision{};  // go on with what runs, and say so
  settled.below_cpu = true;
  settled.note = "OpenBLAS chose " + s.running + " on " + cpu_text(s.cpu) + "; " + failed;
  return 0;
}

const KernelDecision& blas_kernel_decision() { return settled; }

}  // namespace pipetrain
