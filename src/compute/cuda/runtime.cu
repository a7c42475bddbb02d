#include <algorithm>
#include <array>
#include <cstdlib>
#include <string>
#include <unordered_map>
#include <vector>

#include "check.cuh"
#include "pipetrain/compute/gpu.hpp"

namespace pipetrain::gpu {
namespace {

struct Runtime {
  cudaStream_t stream = nullptr;
  cudaStream_t copies = nullptr;          // device-to-host copies beside the compute (copy_to_host_async)
  std::vector<cudaEvent_t> spare_events;  // for reuse: creating an event per copy costs a driver call
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
  if (it != r.sizes.end()) {
    r.allocated -= it->second;
    r.sizes.erase(it);
  }
  cudaFree(p);  // no throw: called from destructors
}

}  // namespace

int device_count() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess) return n;
  cudaGetLastError();  // clear the error so later calls do not report it again
  // No NVIDIA driver library at all reads as "insufficient driver" with driver version 0: a
  // machine without a GPU. A driver that is there but older than this build's runtime, a stub
  // library, or a device that cannot be opened are faults to name.
  int driver = 0;
  cudaDriverGetVersion(&driver);
  if (e == cudaErrorNoDevice || (e == cudaErrorInsufficientDriver && driver == 0)) return 0;
  int runtime_version = 0;
  cudaRuntimeGetVersion(&runtime_version);
  throw std::runtime_error(std::string("CUDA: cannot use the GPUs: cudaGetDeviceCount failed: ") +
                           cudaGetErrorString(e) + " (" + cudaGetErrorName(e) + "; the driver supports CUDA " +
                           cuda_version(driver) + ", this pipetrain was built with CUDA " +
                           cuda_version(runtime_version) + ")");
}

DeviceInfo device_info(int device) {
  cudaDeviceProp prop;
  PT_CUDA(cudaGetDeviceProperties(&prop, device));
  DeviceInfo info;
  info.name = prop.name;
  info.memory_bytes = prop.totalGlobalMem;
  info.capability_major = prop.major;
  info.capability_minor = prop.minor;
  int mode = cudaComputeModeDefault;
  PT_CUDA(cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, device));
  info.mode = mode == cudaComputeModeExclusiveProcess ? ComputeMode::exclusive_process
              : mode == cudaComputeModeProhibited     ? ComputeMode::prohibited
                                                      : ComputeMode::shared;
  PT_CUDA(cudaDeviceGetAttribute(&info.multiprocessors, cudaDevAttrMultiProcessorCount, device));
  PT_CUDA(cudaDeviceGetAttribute(&info.clock_khz, cudaDevAttrClockRate, device));
  PT_CUDA(cudaDriverGetVersion(&info.driver_cuda));
  PT_CUDA(cudaRuntimeGetVersion(&info.runtime_cuda));
  return info;
}

void select_device(int device) { PT_CUDA(cudaSetDevice(device)); }

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
    r.scratch[slot] = nullptr;
    r.scratch_bytes[slot] = 0;
    r.scratch[slot] = allocate(bytes);
    r.scratch_bytes[slot] = bytes;
  }
  return r.scratch[slot];
}

void check_launch(const char* file, int line) {
  check(cudaGetLastError(), "kernel launch", file, line);
  // Kernels run asynchronously: a fault inside one surfaces at the next synchronising call, far
  // from its cause. PIPETRAIN_CUDA_SYNC=1 waits after every launch, so the launch site is named.
  static const bool sync_each = [] {
    const char* v = std::getenv("PIPETRAIN_CUDA_SYNC");
    return v && *v && std::string(v) != "0";
  }();
  if (sync_each) check(cudaStreamSynchronize(stream()), "kernel (waited for: PIPETRAIN_CUDA_SYNC=1)", file, line);
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
void copy_rows_on_device(float* dst, size_t dst_stride, const float* src, size_t src_stride, size_t width,
                         size_t rows) {
  if (rows == 0 || width == 0) return;
  PT_CUDA(cudaMemcpy2DAsync(dst, sizeof(float) * dst_stride, src, sizeof(float) * src_stride, sizeof(float) * width,
                            rows, cudaMemcpyDeviceToDevice, stream()));
}
void zero(void* dst, size_t bytes) { PT_CUDA(cudaMemsetAsync(dst, 0, bytes, stream())); }
void synchronize() { PT_CUDA(cudaStreamSynchronize(stream())); }

namespace {
cudaEvent_t take_event() {
  Runtime& r = runtime();
  cudaEvent_t e = nullptr;
  if (r.spare_events.empty()) {
    PT_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  } else {
    e = r.spare_events.back();
    r.spare_events.pop_back();
  }
  return e;
}
void give_back(cudaEvent_t e) { runtime().spare_events.push_back(e); }
}  // namespace

void* copy_to_host_async(void* dst, const void* src, size_t bytes) {
  Runtime& r = runtime();
  if (!r.copies) PT_CUDA(cudaStreamCreateWithFlags(&r.copies, cudaStreamNonBlocking));
  // The copy stream waits for what the compute stream has queued so far (the kernels that wrote
  // `src`). A wait takes the event's state when it is queued, so the event is free again at once.
  cudaEvent_t queued = take_event();
  PT_CUDA(cudaEventRecord(queued, stream()));
  PT_CUDA(cudaStreamWaitEvent(r.copies, queued, 0));
  give_back(queued);
  PT_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, r.copies));
  cudaEvent_t copied = take_event();
  PT_CUDA(cudaEventRecord(copied, r.copies));
  return copied;
}
bool copy_done(void* token) {
  const auto e = static_cast<cudaEvent_t>(token);
  const cudaError_t status = cudaEventQuery(e);
  if (status == cudaErrorNotReady) return false;
  PT_CUDA(status);
  give_back(e);
  return true;
}
void copy_wait(void* token) {
  const auto e = static_cast<cudaEvent_t>(token);
  PT_CUDA(cudaEventSynchronize(e));
  give_back(e);
}
void pin_host(void* p, size_t bytes) {
  if (bytes) PT_CUDA(cudaHostRegister(p, bytes, cudaHostRegisterDefault));
}
void unpin_host(void* p) {
  if (p) cudaHostUnregister(p);  // no throw: called from destructors
}

size_t memory_allocated() { return runtime().allocated; }
size_t memory_peak() { return runtime().peak; }
size_t memory_total() {
  size_t free = 0, total = 0;
  PT_CUDA(cudaMemGetInfo(&free, &total));
  return total;
}

}  // namespace pipetrain::gpu
