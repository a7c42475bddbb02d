// Runs one stage's action list for one step: forwards and backwards on the Stage, activations and
// gradients to and from the neighbouring stages through Comm. Receives are posted as early as
// their buffers allow (all activation receives at step start, gradient receives two ahead) so data
// arrives while this rank computes; sends are nonblocking from a small ring of buffers.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <functional>
#include <vector>

#include "pipetrain/comm.hpp"
#include "pipetrain/model.hpp"
#include "pipetrain/schedule.hpp"
#include "pipetrain/trace.hpp"

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
  // Inputs (tokens/targets) must already be set on the stage for every micro-batch. Spans go to
  // `trace` while it is recording. `grads_done_from` is handed to the step's last backward, so
  // gradient all-reduces can start while it still runs (see Stage::backward).
  StepStats run(const ActionList& actions, int micro_batches, Trace& trace,
                const std::function<void(size_t)>& grads_done_from = nullptr);

 private:
  static constexpr size_t kRing = 2;
  // Buffers for outgoing messages, reused round-robin once their send completed; each remembers
  // the micro-batch it holds so a send action finds its data whatever the action order.
  struct SendRing {
    std::vector<std::vector<float>> bufs;
    std::vector<MPI_Request> reqs;
    std::vector<int> mb;
    size_t next = 0;
    float* acquire(Comm& comm, int for_mb, const char* what, int peer, Trace& trace);
    size_t slot_of(int for_mb) const;
    void drain(Comm& comm, const char* what, int peer);
  };
  Stage& stage_;
  Comm& comm_;
  SendRing act_out_, grad_out_;
  std::vector<std::vector<float>> grad_in_;
  std::vector<MPI_Request> grad_in_req_;
};

}  // namespace pipetrain
