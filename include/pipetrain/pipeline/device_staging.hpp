// On the GPU the stage reads and writes device memory while messages travel through the host
// rings (MPI moves host memory here): a stage's output and the gradients in and out pass through
// these device buffers. On the CPU each call hands the host buffer straight through and copies
// nothing. A null host buffer (no message: the first or last virtual stage) stays null.
#pragma once
#include <cstddef>

#include "pipetrain/compute/array.hpp"
#include "pipetrain/compute/device.hpp"

namespace pipetrain {

class DeviceStaging {
 public:
  explicit DeviceStaging(size_t floats) : on_(compute_device() == Device::gpu), bytes_(floats * sizeof(float)) {
    if (!on_) return;
    for (Array<float>* a : {&out_, &grad_in_, &grad_out_}) a->resize(floats);
  }
  // Where the stage writes the output bound for `host`; output_done copies it there.
  float* output(float* host) { return on_ && host ? out_.data() : host; }
  void output_done(float* host) {
    if (on_ && host) download(host, out_.data(), bytes_);
  }
  // The received gradient `host`, where the stage can read it.
  const float* grad_in(const float* host) {
    if (!on_ || !host) return host;
    upload(grad_in_.data(), host, bytes_);
    return grad_in_.data();
  }
  // Where the stage writes the input gradient bound for `host`; grad_out_done copies it there.
  float* grad_out(float* host) { return on_ && host ? grad_out_.data() : host; }
  void grad_out_done(float* host) {
    if (on_ && host) download(host, grad_out_.data(), bytes_);
  }

 private:
  bool on_;
  size_t bytes_;
  Array<float> out_, grad_in_, grad_out_;
};

}  // namespace pipetrain
