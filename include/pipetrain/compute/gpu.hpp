// The CUDA runtime side of the GPU build (PIPETRAIN_CUDA=ON), usable from plain C++: which device a
// rank uses, device memory, copies, and the one compute stream every GPU kernel and cuBLAS call of
// a rank runs on (so they are ordered without host synchronisation). Errors throw
// std::runtime_error naming the call, file and line.
#pragma once
#include <cstddef>
#include <string>
#include <utility>

#include "pipetrain/config/choices.hpp"

namespace pipetrain::gpu {

// GPUs this process can use: 0 where the machine has none or no NVIDIA driver at all. Any other
// CUDA error (a driver older than this build's runtime, a stub driver library, no permission on the
// device files) throws std::runtime_error with CUDA's own words, so a broken GPU machine fails
// loudly instead of passing as one without a GPU.
int device_count();

enum class ComputeMode { shared, exclusive_process, prohibited };
struct DeviceInfo {
  std::string name;
  size_t memory_bytes = 0;
  int capability_major = 0, capability_minor = 0;
  ComputeMode mode = ComputeMode::shared;
  int driver_cuda = 0, runtime_cuda = 0;   // CUDA versions as 1000 * major + 10 * minor
  int multiprocessors = 0, clock_khz = 0;  // SMs and their maximum (boost) clock
};
// What device `device` is, read without creating a context on it (so without claiming a GPU in
// exclusive-process mode).
DeviceInfo device_info(int device);
// One line: name, memory, compute capability, compute mode, the driver's and runtime's CUDA.
std::string describe(const DeviceInfo& info);
// Why `ranks_sharing` processes cannot share device `device`, or "" when they can.
std::string sharing_problem(const DeviceInfo& info, int device, int ranks_sharing);

// The device's dense peak GFLOP/s for matrix products with `dtype` inputs (fp32 on the CUDA cores,
// bf16 on the tensor cores, both accumulating in fp32): NVIDIA's datasheet figure for the GPUs it
// lists (A100; H100/H200 SXM, PCIe and NVL), which holds at the clock they sustain; else SMs x
// maximum clock x FLOPs per SM and cycle of its compute capability, an upper bound; 0 for a
// capability neither knows.
double peak_gflops(const DeviceInfo& info, Dtype dtype);
// Which of the two peak_gflops is, in words, for the start-up lines and the GPU check.
std::string peak_basis(const DeviceInfo& info, Dtype dtype);

// "13.0" for CUDA's version number 13000.
std::string cuda_version(int version);

// Makes `device` this process's GPU (creating its context).
void select_device(int device);

void* device_alloc(size_t bytes);  // cudaMalloc; throws on failure, naming the size
void device_free(void* p);
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
void copy_on_device(void* dst, const void* src, size_t bytes);
// device.hpp's copy_rows on device memory (cudaMemcpy2D).
void copy_rows_on_device(float* dst, size_t dst_stride, const float* src, size_t src_stride, size_t width, size_t rows);
void zero(void* dst, size_t bytes);
void synchronize();  // waits for the compute stream
// A device-to-host copy on the copy stream, a second stream beside the compute one: it starts once
// the compute stream has done what was queued before the call, so the kernels queued after it run
// while it travels. `dst` should be pinned (pin_host), or CUDA copies through a bounce buffer and
// the call blocks. Returns a token for copy_done / copy_wait, one of which must spend it.
void* copy_to_host_async(void* dst, const void* src, size_t bytes);
bool copy_done(void* token);  // the copy is complete (and the token spent); false: still travelling
void copy_wait(void* token);  // waits until it is complete; spends the token
// Page-locks host memory so copies between it and the device run asynchronously; unpin_host
// before the memory is freed.
void pin_host(void* p, size_t bytes);
void unpin_host(void* p);
// Device memory this process allocated through this module (buffers and scratch), now and at its
// peak since start-up; as torch.cuda.memory_allocated, not counting the CUDA context.
size_t memory_allocated();
size_t memory_peak();
size_t memory_total();  // the current device's memory

// Device memory for n values of T, freed with the object (move-only).
template <class T>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t n) : n_(n), p_(static_cast<T*>(n ? device_alloc(n * sizeof(T)) : nullptr)) {}
  Buffer(Buffer&& o) noexcept : n_(std::exchange(o.n_, 0)), p_(std::exchange(o.p_, nullptr)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    std::swap(n_, o.n_);
    std::swap(p_, o.p_);
    return *this;
  }
  ~Buffer() { device_free(p_); }
  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  size_t n_ = 0;
  T* p_ = nullptr;
};

}  // namespace pipetrain::gpu
