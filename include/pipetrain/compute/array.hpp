// A growable array of T on the rank's compute device (device.hpp): a std::vector on the CPU,
// device memory on the GPU. resize() behaves as std::vector's (new elements are zero; capacity
// never shrinks, and clear() keeps it), so buffers reused every micro-batch do not reallocate.
// On the CPU fresh memory comes from calloc and is not written on allocation: a large buffer's
// pages are the system's zero pages until first written, so a buffer present only part of the
// time (ZeRO's whole gradients and gathered weights, device.hpp's release_values) costs nothing
// before it is used.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <utility>
#include <vector>

#include "pipetrain/compute/device.hpp"
#include "pipetrain/compute/gpu.hpp"

namespace pipetrain {

// Zeroed memory that allocating does not touch (calloc: large blocks are fresh zero pages), and
// elements that a resize leaves unwritten (Array::resize zeroes those that reuse old capacity).
template <class T>
struct ZeroPagesAllocator {
  using value_type = T;
  ZeroPagesAllocator() = default;
  template <class U>
  ZeroPagesAllocator(const ZeroPagesAllocator<U>&) {}
  T* allocate(size_t n) {
    void* p = std::calloc(n, sizeof(T));
    if (!p && n) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <class U>
  void construct(U*) {}  // value-initialisation: calloc's zeros, or Array::resize's
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  template <class U>
  bool operator==(const ZeroPagesAllocator<U>&) const {
    return true;
  }
  template <class U>
  bool operator!=(const ZeroPagesAllocator<U>&) const {
    return false;
  }
};
template <class T>
using HostVector = std::vector<T, ZeroPagesAllocator<T>>;

template <class T>
class Array {
 public:
  Array() : on_gpu_(compute_device() == Device::gpu) {}
  explicit Array(size_t n) : Array() { resize(n); }

  T* data() { return on_gpu_ ? dev_.data() : host_.data(); }
  const T* data() const { return on_gpu_ ? dev_.data() : host_.data(); }
  size_t size() const { return on_gpu_ ? size_ : host_.size(); }
  bool empty() const { return size() == 0; }
  bool on_gpu() const { return on_gpu_; }

  void resize(size_t n) {
    if (!on_gpu_) {
      const size_t old = host_.size(), capacity = host_.capacity();
      host_.resize(n);  // beyond the old capacity: fresh zeroed memory, untouched
      if (n > old && old < capacity) std::fill(host_.data() + old, host_.data() + std::min(n, capacity), T{});
      return;
    }
    if (n > dev_.size()) {
      gpu::Buffer<T> bigger(n);
      if (size_) gpu::copy_on_device(bigger.data(), dev_.data(), size_ * sizeof(T));
      dev_ = std::move(bigger);
    }
    if (n > size_) gpu::zero(dev_.data() + size_, (n - size_) * sizeof(T));
    size_ = n;
  }
  void clear() {
    if (on_gpu_) size_ = 0;
    else host_.clear();
  }
  // Contents from / to host memory.
  void assign(const T* host_src, size_t n) {
    resize(n);
    upload(data(), host_src, n * sizeof(T));
  }
  std::vector<T> to_host() const {
    std::vector<T> out(size());
    download(out.data(), data(), size() * sizeof(T));
    return out;
  }
  // The host vector itself, for code that runs on the CPU only (throws for a GPU array).
  HostVector<T>& host() { return on_gpu_ ? cpu_only() : host_; }
  const HostVector<T>& host() const { return on_gpu_ ? cpu_only() : host_; }

  void swap(Array& o) noexcept {
    std::swap(on_gpu_, o.on_gpu_);
    host_.swap(o.host_);
    std::swap(dev_, o.dev_);
    std::swap(size_, o.size_);
  }

 private:
  [[noreturn]] static HostVector<T>& cpu_only() { throw std::logic_error("a GPU array used as a host vector"); }
  bool on_gpu_;
  HostVector<T> host_;
  gpu::Buffer<T> dev_;
  size_t size_ = 0;  // GPU arrays: elements in use (dev_.size() is the capacity)
};

template <class T>
void swap(Array<T>& a, Array<T>& b) noexcept {
  a.swap(b);
}

}  // namespace pipetrain
