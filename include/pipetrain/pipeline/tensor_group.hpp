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
  void all_gather(const float* part, float* whole, size_t n) override;
  void reduce_scatter(const float* whole, float* part, size_t n) override;
  struct Span {
    const char* name;
    double t0, t1;  // now_s()
  };
  // The collectives since the last call.
  std::vector<Span> take_spans() { return std::exchange(spans_, {}); }

 private:
  template <class T, class Reduce>
  void staged(const char* name, T* buf, size_t n, Reduce reduce);
  // The same for a collective from one buffer into another (n_in and n_out floats).
  template <class Move>
  void staged_move(const char* name, const float* in, size_t n_in, float* out, size_t n_out, Move move);
  Comm& comm_;
  std::vector<float> floats_, floats_out_;
  std::vector<double> doubles_;
  std::vector<Span> spans_;
};

}  // namespace pipetrain
