// The GPU API of a build without CUDA: no device, and every other call says how to get one. Keeps
// callers free of #ifdefs (device.cpp refuses Device::gpu before any of these could run).
#include <stdexcept>

#include "pipetrain/compute/gpu.hpp"
#include "pipetrain/compute/gpu_kernels.hpp"

namespace pipetrain::gpu {
namespace {
[[noreturn]] void no_cuda() {
  throw std::runtime_error("this pipetrain was built without CUDA (cmake -DPIPETRAIN_CUDA=ON)");
}
}  // namespace

int device_count() { return 0; }
DeviceInfo device_info(int) { no_cuda(); }
void select_device(int) { no_cuda(); }
void* device_alloc(size_t) { no_cuda(); }
void device_free(void*) {}
void copy_to_device(void*, const void*, size_t) { no_cuda(); }
void copy_to_host(void*, const void*, size_t) { no_cuda(); }
void copy_on_device(void*, const void*, size_t) { no_cuda(); }
void copy_rows_on_device(float*, size_t, const float*, size_t, size_t, size_t) { no_cuda(); }
void zero(void*, size_t) { no_cuda(); }
void synchronize() { no_cuda(); }
void* copy_to_host_async(void*, const void*, size_t) { no_cuda(); }
bool copy_done(void*) { no_cuda(); }
void copy_wait(void*) { no_cuda(); }
void pin_host(void*, size_t) { no_cuda(); }
void unpin_host(void*) {}
size_t memory_allocated() { return 0; }
size_t memory_peak() { return 0; }
size_t memory_total() { return 0; }

// Every layer kernel of the list, answering "no CUDA" (its parameters unused).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#define PIPETRAIN_NO_CUDA_KERNEL(ret, name, params) \
  ret name params { no_cuda(); }
PIPETRAIN_LAYER_KERNELS(PIPETRAIN_NO_CUDA_KERNEL)
#undef PIPETRAIN_NO_CUDA_KERNEL
#pragma GCC diagnostic pop
void gelu_forward(float*, const float*, size_t) { no_cuda(); }
void adamw_update(float*, const float*, float*, float*, size_t, float, float, float, float, float, float, float) {
  no_cuda();
}
double sum_of_squares(const float*, size_t) { no_cuda(); }
void matmul_forward_bf16(float*, const float*, const float*, const float*, int, int, int) { no_cuda(); }
void matmul_backward_bf16(float*, float*, float*, const float*, const float*, const float*, int, int, int) {
  no_cuda();
}
double measure_gemm_gflops(Dtype, int, double) { no_cuda(); }
double time_gemms(int, int) { no_cuda(); }

}  // namespace pipetrain::gpu
