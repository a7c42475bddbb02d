// Runs one stage's action list for one step: forwards and backwards on the Stage, activations and
// gradients to and from the neighbouring stages through Comm. Receives are posted two ahead into a
// small ring of buffers, so data arrives while this rank computes and a micro-batch's activations
// exist only from its forward to its backward, whatever the schedule; sends are nonblocking from a
// ring of buffers too.
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
  // `load_inputs(mb)` sets tokens (first stage) / targets (last stage) of micro-batch mb on the
  // stage; it is called just before that micro-batch's forward. Spans go to `trace` while it is
  // recording. `grads_done_from` is handed to the step's last backward, so gradient all-reduces
  // can start while it still runs (see Stage::backward).
  StepStats run(const ActionList& actions, int micro_batches, Trace& trace, const std::function<void(int)>& load_inputs,
                const std::function<void(size_t)>& grads_done_from = nullptr);

 private:
  static constexpr size_t kRing = 2;
  // Receives posted in the order the list consumes them, at most kRing ahead, round-robin over
  // kRing buffers.
  struct RecvRing {
    std::vector<std::vector<float>> bufs;
    std::vector<MPI_Request> reqs;
    std::vector<int> order;  // micro-batches in the order the list receives them
    size_t posted = 0, used = 0;
    void post(Comm& comm, int peer, int (*tag)(int));
    float* wait(Comm& comm, const WaitLabel& label);  // the next one, in order
  };
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
  RecvRing act_in_, grad_in_;
};

}  // namespace pipetrain
