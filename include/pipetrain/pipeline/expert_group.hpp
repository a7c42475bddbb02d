// A Stage's expert-group all-to-alls (model/expert_parallel.hpp) over the run's Comm. MPI moves
// host memory here, so on the GPU the rows go through host copies. The time inside them is the ep_comm kernel class's,
// and each is kept as a span until the executor takes it for the trace's own track.
#pragma once
#include <utility>
#include <vector>

#include "pipetrain/dist/comm.hpp"
#include "pipetrain/model/expert_parallel.hpp"

namespace pipetrain {

class CommExpertGroup : public ExpertGroup {
 public:
  explicit CommExpertGroup(Comm& comm) : comm_(comm) {}
  void all_to_all(const int* send, int* recv, int n) override;
  void all_to_all(const float* send, const std::vector<int>& send_counts, float* recv,
                  const std::vector<int>& recv_counts) override;
  struct Span {
    const char* name;
    double t0, t1;  // now_s()
  };
  // The all-to-alls since the last call.
  std::vector<Span> take_spans() { return std::exchange(spans_, {}); }

 private:
  Comm& comm_;
  std::vector<float> sent_, received_;  // on the GPU: the rows' host copies
  std::vector<Span> spans_;
};

}  // namespace pipetrain
