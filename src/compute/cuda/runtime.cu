#include <algorithm>
#include <array>
#include <unordered_map>

#include "check.cuh"
#include "pipetrain/compute/gpu.hpp"

namespace pipetrain::gpu {
namespace {

struct Runtime {
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  std::array<void*, 8> scratch{};
  std::array<size_t, 8> scratch_bytes{};
  std::unordered_map<void*, size_t> sizes;  // live allocations, for memory_allocated()
  size_t allocated = 0, peak = 0;
};
Runtime& runtime() {
  static Runtime r;  // lives until exit: freeing after the driver shut down would fail
  return r;
}

void* allocate(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error("CUDA: cannot allocate " + std::to_string(bytes) + " bytes on the GPU (" +
                             cudaGetErrorString(e) + "; " + std::to_string(runtime().allocated) +
                             " bytes already allocated)");
  }
  Runtime& r = runtime();
  r.sizes[p] = bytes;
  r.allocated += bytes;
  r.peak = std::max(r.peak, r.allocated);
  return p;
}
void release(void* p) {
  if (!p) return;
  Runtime& r = runtime();
  auto it = r.sizes.find(p);
  if (it != r.sizes.end()) r.allocated -= it->second, r.sizes.erase(it);
  cudaFree(p);  // no throw: called from destructors
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device / no driver" error
    return 0;
  }
  return n;
}

int select_device(int local_rank) {
  const int n = device_count();
  if (n == 0) throw std::runtime_error("CUDA: no GPU visible to this process (CUDA_VISIBLE_DEVICES, driver?)");
  const int device = local_rank % n;
  PT_CUDA(cudaSetDevice(device));
  return device;
}

std::string device_name() {
  int device = 0;
  PT_CUDA(cudaGetDevice(&device));
  cudaDeviceProp prop;
  PT_CUDA(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

cudaStream_t stream() {
  Runtime& r = runtime();
  if (!r.stream) PT_CUDA(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
  return r.stream;
}

cublasHandle_t cublas() {
  Runtime& r = runtime();
  if (!r.cublas) {
    PT_CUDA(cublasCreate(&r.cublas));
    PT_CUDA(cublasSetStream(r.cublas, stream()));
    // The default math mode never lowers fp32 products to TF32 (that takes CUBLAS_TF32_TENSOR_OP_MATH),
    // so fp32 results match the CPU's to float rounding; bf16 inputs use the tensor cores.
  }
  return r.cublas;
}

void* scratch(int slot, size_t bytes) {
  Runtime& r = runtime();
  if (r.scratch_bytes.at(slot) < bytes) {
    PT_CUDA(cudaStreamSynchronize(stream()));  // the old buffer may still be in use
    release(r.scratch[slot]);
    r.scratch[slot] = nullptr, r.scratch_bytes[slot] = 0;
    r.scratch[slot] = allocate(bytes);
    r.scratch_bytes[slot] = bytes;
  }
  return r.scratch[slot];
}

void* device_alloc(size_t bytes) { return allocate(bytes); }
void device_free(void* p) { release(p); }

void copy_to_device(void* dst, const void* src, size_t bytes) {
  PT_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()));
  PT_CUDA(cudaStreamSynchronize(stream()));  // pageable host memory: the source may be reused at once
}
void copy_to_host(void* dst, const void* src, size_t bytes) {
  PT_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()));
  PT_CUDA(cudaStreamSynchronize(stream()));
}
void copy_on_device(void* dst, const void* src, size_t bytes) {
  PT_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
}
void zero(void* dst, size_t bytes) { PT_CUDA(cudaMemsetAsync(dst, 0, bytes, stream())); }
void synchronize() { PT_CUDA(cudaStreamSynchronize(stream())); }

size_t memory_allocated() { return runtime().allocated; }
size_t memory_peak() { return runtime().peak; }
size_t memory_total() {
  size_t free = 0, total = 0;
  PT_CUDA(cudaMemGetInfo(&free, &total));
  return total;
}

}  // namespace pipetrain::gpu
