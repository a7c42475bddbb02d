// A Stage's tensor-group collectives (model/tensor_parallel.hpp) over the run's Comm. MPI moves
// host memory here, so on the GPU each reduction goes through a host copy; on the CPU it works on
// the buffer itself. The time inside them is the tp_comm kernel class's, and each is kept as a
// span until the executor takes it for the trace.
#pragma once
#include <utility>
#include <vector>

#include "pipetrain/dist/comm.hpp"
#include "pipetrain/model/tensor_parallel.hpp"

namespace pipetrain {

class CommTensorGroup : public TensorGroup {
 public:
  explicit CommTensorGroup(Comm& comm) : comm_(comm) {}
  void sum(float* buf, size_t n) override;
  void sum(double* buf, size_t n) override;
  void max(float* buf, size_t n) override;
  struct Span {
    const char* name;
    double t0, t1;  // now_s()
  };
  // The collectives since the last call.
  std::vector<Span> take_spans() { return std::exchange(spans_, {}); }

 private:
  template <class T, class Reduce>
  void staged(const char* name, T* buf, size_t n, Reduce reduce);
  Comm& comm_;
  std::vector<float> floats_;
  std::vector<double> doubles_;
  std::vector<Span> spans_;
};

}  // namespace pipetrain
