// Runs one stage's action list for one step: forwards and backwards on the Stage, activations and
// gradients to and from the neighbouring stages through Comm. Receives are posted as early as
// their buffers allow (all activation receives at step start, gradient receives two ahead) so data
// arrives while this rank computes; sends are nonblocking from a small ring of buffers.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <vector>

#include "pipetrain/comm.hpp"
#include "pipetrain/model.hpp"
#include "pipetrain/schedule.hpp"

namespace pipetrain {

struct StepStats {
  double compute_s = 0;        // forward + backward (incl. recompute) time
  double wait_s = 0;           // time blocked on pipeline peers
  double loss_sum = 0;         // summed token loss over this rank's micro-batches (last stage)
  size_t act_peak_bytes = 0;   // peak of activations held between forward and backward
};

class Executor {
 public:
  Executor(Stage& stage, Comm& comm);
  // Inputs (tokens/targets) must already be set on the stage for every micro-batch.
  StepStats run(const ActionList& actions, int micro_batches);

 private:
  float* acquire(std::vector<std::vector<float>>& ring, std::vector<MPI_Request>& pending, size_t& next,
                 const WaitLabel& label);
  Stage& stage_;
  Comm& comm_;
  static constexpr size_t kRing = 2;
  std::vector<std::vector<float>> act_out_, grad_out_, grad_in_;
  std::vector<MPI_Request> act_out_req_, grad_out_req_, grad_in_req_;
};

}  // namespace pipetrain
