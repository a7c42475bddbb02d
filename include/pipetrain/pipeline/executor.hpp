// Runs one stage's action list for one step: forwards and backwards on the Stage's chunks,
// activations and gradients to and from the ranks holding the neighbouring virtual stages through
// Comm (wherever the schedule's placement puts them: round the ring of stages under the
// interleaved schedule, down and back up in a vee, where the turn is a message to this rank
// itself). Receives are posted two ahead into a small ring of buffers, so data arrives while this
// rank computes and a micro-batch's activations exist only from its forward to its backward,
// whatever the schedule; sends are nonblocking from a ring of buffers too.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "pipetrain/dist/comm.hpp"
#include "pipetrain/model/model.hpp"
#include "pipetrain/schedule/actions.hpp"
#include "pipetrain/observe/trace.hpp"

namespace pipetrain {

struct StepStats {
  double compute_s = 0;        // forward + backward (incl. recompute) time
  double compute_cpu_s = 0;    // the same passes' CPU time (this thread's), when asked for (Executor::time_cpu)
  double wait_s = 0;           // time blocked on pipeline peers
  double loss_sum = 0;         // summed token loss over this rank's micro-batches (last stage)
  size_t act_peak_bytes = 0;   // peak of activations held between forward and backward
  // By sending stage (never this rank's own): how long each message this rank had to wait for
  // took to come, from when it could first travel (sent, and its receive posted) to its arrival.
  // Messages that arrived while the rank computed are left out: their arrival time is unknown,
  // and a link nobody waits on costs the step nothing.
  std::map<int, std::vector<double>> transfer_s;
};

class Executor {
 public:
  // Runs steps of `shape` (micro-batches, virtual stages) on this rank's stage.
  Executor(Stage& stage, Comm& comm, const StepShape& shape);
  // `load_inputs(mb)` sets tokens (first virtual stage) / targets (last) of micro-batch mb on the
  // stage; it is called just before that micro-batch's forward there. A micro-batch the list
  // never runs backward for (forward_only lists: evaluation) is dropped right after its forward. Spans go to `trace` while it
  // is recording. `grads_done_from` is handed to each chunk's last backward (when the chunks finish
  // from the last to the first, as the buffers are laid out), so gradient all-reduces can start
  // while the step still runs (see Stage::backward). `params_needed(chunk)` is called before each
  // forward of a chunk (ZeRO-1 waits there for that chunk's updated weights; true if it waited).
  StepStats run(const ActionList& actions, Trace& trace, const std::function<void(int)>& load_inputs,
                const std::function<void(size_t)>& grads_done_from = nullptr,
                const std::function<bool(int)>& params_needed = nullptr);

  // The largest message tag a step of `shape` uses (it must fit below World::max_tag()).
  static int64_t max_tag(const StepShape& shape);
  // How world rank 0's clock reads against this rank's now_s() (Comm::clock_offset_to_root):
  // every message carries its send time on rank 0's clock, so the receiver can time its travel.
  void set_clock_offset(double offset_s) { clock_offset_s_ = offset_s; }
  // Also time the passes in CPU time (StepStats::compute_cpu_s): two system calls per pass, so only
  // when straggler detection compares CPU time (ranks outnumbering cores).
  void time_cpu(bool on) { time_cpu_ = on; }

 private:
  static constexpr size_t kRing = kMessageRing;
  // A message is one activation (or its gradient) and then its send time, a double in two floats.
  static constexpr size_t kStampFloats = 2;
  // kRing buffers of one message each and their requests, for the link with `peer`.
  struct Ring {
    int peer = -1;
    std::vector<std::vector<float>> bufs;
    std::vector<MPI_Request> reqs;
    void open(int with, size_t floats) {
      peer = with;
      bufs.assign(kRing, std::vector<float>(floats + kStampFloats));
      reqs.assign(kRing, MPI_REQUEST_NULL);
    }
  };
  // One per incoming link (schedule/placement.hpp): receives posted in the order the list consumes
  // them, at most kRing ahead, round-robin over kRing buffers.
  struct RecvRing : Ring {
    std::vector<int> order;  // message tags in the order the list receives them
    std::vector<double> posted_at;  // per buffer: when its receive was posted (rank 0's clock)
    size_t posted = 0, used = 0;
    void post(Comm& comm, double clock_offset_s);
    // The next message, in order; if it had not arrived yet, how long it travelled goes to `transfer_s`.
    float* wait(Comm& comm, const WaitLabel& label, double clock_offset_s, std::vector<double>& transfer_s);
  };
  // One per outgoing link: buffers reused round-robin once their send completed; each remembers
  // the message (tag) it holds so a send action finds its data whatever the action order.
  struct SendRing : Ring {
    std::vector<int> tag, mb;
    size_t next = 0;
    float* acquire(Comm& comm, int for_tag, int for_mb, const char* what, Trace& trace);
    size_t slot_of(int for_tag, const Action& a) const;
    void drain(Comm& comm, const char* what);
  };
  // One MPI_Test of every pending message, called at the stage's poll points (Stage::set_poll).
  void progress();
  Stage& stage_;
  Comm& comm_;
  StepShape shape_;
  double clock_offset_s_ = 0;
  bool time_cpu_ = false;
  // On the GPU the stage reads and writes device memory while messages travel through the host
  // rings (comm.backend = mpi): its output, incoming and outgoing gradient are staged here.
  Floats dev_out_, dev_grad_in_, dev_grad_out_;
  std::map<MessageLink, SendRing> out_;  // keyed by link (grad, in = false, peer)
  std::map<MessageLink, RecvRing> in_;   // (grad, in = true, peer)
};

}  // namespace pipetrain
