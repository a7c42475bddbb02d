#include "pipetrain/compute/device.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "pipetrain/compute/bf16_products.hpp"
#include "pipetrain/compute/gpu.hpp"
#include "pipetrain/compute/gpu_kernels.hpp"
#include "pipetrain/compute/kernels.hpp"
#include "pipetrain/compute/profile.hpp"

#ifndef PIPETRAIN_HAVE_CUDA
#define PIPETRAIN_HAVE_CUDA 0
#endif

namespace pipetrain {
namespace {
Device g_device = Device::cpu;
int g_gpu = -1;
}  // namespace

Device compute_device() { return g_device; }
int compute_gpu() { return g_gpu; }
bool cuda_built() { return PIPETRAIN_HAVE_CUDA; }

void set_compute_device(Device d, int local_rank, int local_ranks) {
  if (d == Device::gpu) {
    if (!cuda_built()) throw std::runtime_error("this pipetrain was built without CUDA (cmake -DPIPETRAIN_CUDA=ON)");
    const int n = gpu::device_count();
    if (n == 0) throw std::runtime_error("CUDA: no GPU visible to this process (CUDA_VISIBLE_DEVICES, driver?)");
    const int device = local_rank % n;
    // Read before the context is made: in exclusive-process mode the second rank would otherwise
    // fail with a bare "busy or unavailable", and the first would run on alone.
    const std::string problem = gpu::sharing_problem(gpu::device_info(device), device, (local_ranks + n - 1) / n);
    if (!problem.empty()) throw std::runtime_error(problem);
    gpu::select_device(device);
    g_gpu = device;
  }
  g_device = d;
}

void use_spec_device(const RunSpec& spec, int local_rank, int local_ranks) {
  if (spec.run.device == Device::cpu && spec.model.dtype == Dtype::bf16 && !bf16_products().available)
    throw SpecError(spec.origin("model.dtype") +
                    ": model.dtype = bf16 on the CPU: oneDNN has no bf16 matrix product for this CPU (" +
                    bf16_products().isa + "; it needs AVX-512). Use model.dtype = \"fp32\"");
  if (spec.run.device != Device::gpu) return;
  try {
    set_compute_device(Device::gpu, local_rank, local_ranks);
  } catch (const std::runtime_error& e) {
    throw SpecError(spec.origin("run.device") + ": run.device = gpu: " + e.what());
  }
}

double time_matrix_products(int n, int reps) {
  return g_device == Device::gpu ? gpu::time_gemms(n, reps) : time_sgemms(n, reps);
}

void copy_values(float* dst, const float* src, size_t n) {
  KernelTimer timer(Kernel::memory);
  if (g_device == Device::gpu) gpu::copy_on_device(dst, src, n * sizeof(float));
  else std::copy(src, src + n, dst);
}
void copy_rows(float* dst, size_t dst_stride, const float* src, size_t src_stride, size_t width, size_t rows) {
  KernelTimer timer(Kernel::memory);
  if (g_device == Device::gpu) return gpu::copy_rows_on_device(dst, dst_stride, src, src_stride, width, rows);
  for (size_t r = 0; r < rows; ++r) std::copy_n(src + r * src_stride, width, dst + r * dst_stride);
}
void zero_values(float* dst, size_t n) {
  KernelTimer timer(Kernel::memory);
  if (g_device == Device::gpu) gpu::zero(dst, n * sizeof(float));
  else std::fill(dst, dst + n, 0.f);
}
void release_values(float* dst, size_t n) {
  KernelTimer timer(Kernel::memory);
  if (g_device == Device::gpu) return gpu::zero(dst, n * sizeof(float));
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(dst), end = reinterpret_cast<uintptr_t>(dst + n);
  const uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;  // whole pages inside
  if (first >= last) return std::fill(dst, dst + n, 0.f);
  std::memset(dst, 0, first - begin);
  std::memset(reinterpret_cast<void*>(last), 0, end - last);
  // Private anonymous pages (malloc's): MADV_DONTNEED frees them and they read as zeros after. A
  // range released once is released again and again (every step): asking for huge pages there
  // makes faulting it back in one fault per 2 MiB instead of per 4 KiB.
  madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
  if (madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) != 0)
    std::memset(reinterpret_cast<void*>(first), 0, last - first);
}
void finish_compute() {
  if (g_device == Device::gpu) gpu::synchronize();
}
void upload(void* dst, const void* host_src, size_t bytes) {
  KernelTimer timer(Kernel::memory);
  if (g_device == Device::gpu) gpu::copy_to_device(dst, host_src, bytes);
  else if (bytes) std::memmove(dst, host_src, bytes);
}
void download(void* host_dst, const void* src, size_t bytes) {
  KernelTimer timer(Kernel::memory);
  if (g_device == Device::gpu) gpu::copy_to_host(host_dst, src, bytes);
  else if (bytes) std::memmove(host_dst, src, bytes);
}

DeviceCopy::DeviceCopy(void* host_dst, const void* src, size_t bytes) {
  KernelTimer timer(Kernel::memory);
  if (g_device == Device::gpu) token_ = gpu::copy_to_host_async(host_dst, src, bytes);
  else if (bytes) std::memmove(host_dst, src, bytes);
}
DeviceCopy::DeviceCopy(DeviceCopy&& o) noexcept : token_(std::exchange(o.token_, nullptr)) {}
DeviceCopy& DeviceCopy::operator=(DeviceCopy&& o) noexcept {
  std::swap(token_, o.token_);
  return *this;
}
DeviceCopy::~DeviceCopy() {
  try {
    wait();
  } catch (...) {  // a failed GPU is reported by whatever touches it next
  }
}
bool DeviceCopy::done() {
  if (token_ && gpu::copy_done(token_)) token_ = nullptr;
  return !token_;
}
void DeviceCopy::wait() {
  if (token_) gpu::copy_wait(std::exchange(token_, nullptr));
}

HostPin::HostPin(void* p, size_t bytes) {
  if (g_device != Device::gpu || !bytes) return;
  gpu::pin_host(p, bytes);
  p_ = p;
}
HostPin::HostPin(HostPin&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
HostPin& HostPin::operator=(HostPin&& o) noexcept {
  std::swap(p_, o.p_);
  return *this;
}
HostPin::~HostPin() { gpu::unpin_host(p_); }

}  // namespace pipetrain
