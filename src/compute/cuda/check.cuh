// Error checks for CUDA and cuBLAS calls: a failure throws std::runtime_error naming the call.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace pipetrain::gpu {

inline void check(cudaError_t e, const char* call, const char* file, int line) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("CUDA: ") + call + " failed at " + file + ":" + std::to_string(line) + ": " +
                             cudaGetErrorString(e));
}
inline void check(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuBLAS: ") + call + " failed at " + file + ":" + std::to_string(line) +
                             ": status " + std::to_string(static_cast<int>(s)));
}

// The rank's compute stream and cuBLAS handle (runtime.cu), created on first use.
cudaStream_t stream();
cublasHandle_t cublas();
// Grow-only scratch on the device for kernels that need temporary space; valid until the next
// call with the same slot. Slots let one kernel hold several scratch buffers at once.
void* scratch(int slot, size_t bytes);
// After a kernel launch (PT_LAUNCH, launch.cuh): throws on a launch error and, under
// PIPETRAIN_CUDA_SYNC=1, waits for the kernel and throws on a fault inside it, naming the launch's
// file and line either way.
void check_launch(const char* file, int line);

}  // namespace pipetrain::gpu

#define PT_CUDA(call) ::pipetrain::gpu::check((call), #call, __FILE__, __LINE__)
