// Where this rank computes: the CPU, or its GPU in a CUDA build (PIPETRAIN_CUDA=ON). Chosen once at
// start-up, before any Stage exists; Arrays and ops follow it. It is the one piece of process
// state the compute layer keeps, on purpose: CUDA binds a process's thread to one device
// (cudaSetDevice), and every allocation must land where that binding says, so passing the device
// to each Array would only let two disagree. What depends on the spec (model.dtype's products)
// lives in the Stage's kernel table (ops.hpp).
#pragma once
#include <cstddef>

#include "pipetrain/config/spec.hpp"

namespace pipetrain {

Device compute_device();
int compute_gpu();  // the GPU this rank selected (-1 on the CPU)
// gpu: selects GPU local_rank % (GPUs on the node) for one of local_ranks ranks on the node;
// throws std::runtime_error naming the reason when this build has no CUDA, the node has no GPU,
// CUDA cannot use it (with CUDA's error), or its compute mode forbids the sharing.
void set_compute_device(Device d, int local_rank = 0, int local_ranks = 1);
bool cuda_built();  // this binary contains the CUDA kernels
// The device `spec` asks for (run.device), for a
// rank that is `local_rank` of `local_ranks` on its node; throws SpecError naming run.device when it
// cannot be had.
void use_spec_device(const RunSpec& spec, int local_rank, int local_ranks);

// Seconds for `reps` products of n x n matrices on the compute device: a fixed workload whose time
// compares one rank's speed with another's.
double time_matrix_products(int n, int reps);

// Copies and zeroing within the compute device's memory.
void copy_values(float* dst, const float* src, size_t n);
// `rows` rows of `width` floats, src's src_stride apart into dst's dst_stride apart (one strided
// copy on the GPU).
void copy_rows(float* dst, size_t dst_stride, const float* src, size_t src_stride, size_t width, size_t rows);
void zero_values(float* dst, size_t n);
// Zeroes [dst, dst + n) and gives its memory back where it can: on the CPU the whole pages inside
// the range return to the system (they read as zeros, and are faulted in again when next
// written); the partial pages at its ends are zeroed in place. A buffer that is present only part
// of the time (ZeRO's unsharded gradients and gathered weights) is released so. On the GPU the
// range is only zeroed (device memory stays allocated).
void release_values(float* dst, size_t n);
// Waits until the compute device has finished what was queued (GPU kernels run asynchronously;
// timings must not stop before them). No-op on the CPU.
void finish_compute();
// Between the host and the compute device (plain copies on the CPU).
void upload(void* dst, const void* host_src, size_t bytes);
void download(void* host_dst, const void* src, size_t bytes);

// A download that runs beside the compute: on the GPU a copy on the copy stream, started once the
// kernels queued so far are done (so it carries what they wrote), into host memory best pinned
// with HostPin; on the CPU a plain copy, done at once. The host checks on it without waiting.
class DeviceCopy {
 public:
  DeviceCopy() = default;  // nothing travelling
  DeviceCopy(void* host_dst, const void* src, size_t bytes);
  DeviceCopy(DeviceCopy&& o) noexcept;
  DeviceCopy& operator=(DeviceCopy&& o) noexcept;
  ~DeviceCopy();  // waits: the host memory must not be written behind the owner's back
  bool done();    // arrived (true from then on)
  void wait();

 private:
  void* token_ = nullptr;  // the GPU's copy, until seen done
};

// Page-locks a host buffer while the object lives, so GPU copies to and from it run asynchronously;
// nothing on the CPU. The buffer must outlive it.
class HostPin {
 public:
  HostPin() = default;
  HostPin(void* p, size_t bytes);
  HostPin(HostPin&& o) noexcept;
  HostPin& operator=(HostPin&& o) noexcept;
  ~HostPin();

 private:
  void* p_ = nullptr;
};

}  // namespace pipetrain
