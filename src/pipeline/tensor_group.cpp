#include "pipetrain/pipeline/tensor_group.hpp"

#include <type_traits>

#include "pipetrain/compute/device.hpp"
#include "pipetrain/compute/profile.hpp"
#include "pipetrain/util/clock.hpp"

namespace pipetrain {

template <class T, class Reduce>
void CommTensorGroup::staged(const char* name, T* buf, size_t n, Reduce reduce) {
  KernelTimer timer(Kernel::tp_comm);
  const double t0 = now_s();
  if (compute_device() != Device::gpu) {
    reduce(buf);
  } else {
    std::vector<T>& host = [this]() -> std::vector<T>& {
      if constexpr (std::is_same_v<T, float>) return floats_;
      else return doubles_;
    }();
    host.resize(n);
    download(host.data(), buf, n * sizeof(T));
    reduce(host.data());
    upload(buf, host.data(), n * sizeof(T));
  }
  spans_.push_back({name, t0, now_s()});
}

template <class Move>
void CommTensorGroup::staged_move(const char* name, const float* in, size_t n_in, float* out, size_t n_out, Move move) {
  KernelTimer timer(Kernel::tp_comm);
  const double t0 = now_s();
  if (compute_device() != Device::gpu) {
    move(in, out);
  } else {
    floats_.resize(n_in);
    floats_out_.resize(n_out);
    download(floats_.data(), in, n_in * sizeof(float));
    move(floats_.data(), floats_out_.data());
    upload(out, floats_out_.data(), n_out * sizeof(float));
  }
  spans_.push_back({name, t0, now_s()});
}

void CommTensorGroup::all_gather(const float* part, float* whole, size_t n) {
  const size_t all = n * comm_.topo().tp;
  staged_move("tp all-gather", part, n, whole, all, [&](const float* i, float* o) { comm_.allgather_tensor(i, o, n); });
}
void CommTensorGroup::reduce_scatter(const float* whole, float* part, size_t n) {
  const size_t all = n * comm_.topo().tp;
  staged_move("tp reduce-scatter", whole, all, part, n,
              [&](const float* i, float* o) { comm_.reduce_scatter_tensor(i, o, n); });
}

void CommTensorGroup::sum(float* buf, size_t n) {
  staged("tp sum", buf, n, [&](float* b) { comm_.allreduce_tensor(b, n); });
}
void CommTensorGroup::sum(double* buf, size_t n) {
  staged("tp sum (loss)", buf, n, [&](double* b) { comm_.allreduce_tensor(b, n); });
}
void CommTensorGroup::max(float* buf, size_t n) {
  staged("tp max (loss)", buf, n, [&](float* b) { comm_.allmax_tensor(b, n); });
}

}  // namespace pipetrain
