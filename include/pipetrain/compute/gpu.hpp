// The CUDA runtime side of the GPU build (PIPETRAIN_CUDA=ON), usable from plain C++: which device a
// rank uses, device memory, copies, and the one compute stream every GPU kernel and cuBLAS call of
// a rank runs on (so they are ordered without host synchronisation). Errors throw
// std::runtime_error naming the call, file and line.
#pragma once
#include <cstddef>
#include <string>
#include <utility>

namespace pipetrain::gpu {

// GPUs this process can use; 0 when there is none or no usable driver (never throws).
int device_count();
// Uses device local_rank % device_count() (SLURM_LOCALID / the MPI node-local rank), so ranks on
// one node spread over its GPUs and several ranks can share one. Returns the device index.
int select_device(int local_rank);
std::string device_name();

void* device_alloc(size_t bytes);  // cudaMalloc; throws on failure, naming the size
void device_free(void* p);
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
void copy_on_device(void* dst, const void* src, size_t bytes);
void zero(void* dst, size_t bytes);
void synchronize();  // waits for the compute stream
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
    std::swap(n_, o.n_), std::swap(p_, o.p_);
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
