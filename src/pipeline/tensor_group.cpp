#include "pipetrain/pipeline/tensor_group.hpp"

#include <type_traits>

#include "pipetrain/compute/device.hpp"
#include "pipetrain/compute/profile.hpp"

namespace pipetrain {

template <class T, class Reduce>
void CommTensorGroup::staged(T* buf, size_t n, Reduce reduce) {
  KernelTimer timer(Kernel::tp_comm);
  if (compute_device() != Device::gpu) return reduce(buf);
  std::vector<T>& host = [this]() -> std::vector<T>& {
    if constexpr (std::is_same_v<T, float>) return floats_;
    else return doubles_;
  }();
  host.resize(n);
  download(host.data(), buf, n * sizeof(T));
  reduce(host.data());
  upload(buf, host.data(), n * sizeof(T));
}

void CommTensorGroup::sum(float* buf, size_t n) {
  staged(buf, n, [&](float* b) { comm_.allreduce_tensor(b, n); });
}
void CommTensorGroup::sum(double* buf, size_t n) {
  staged(buf, n, [&](double* b) { comm_.allreduce_tensor(b, n); });
}
void CommTensorGroup::max(float* buf, size_t n) {
  staged(buf, n, [&](float* b) { comm_.allmax_tensor(b, n); });
}

}  // namespace pipetrain
