// Runs one stage's action list for one step: forwards and backwards on the Stage's chunks,
// activations and gradients to and from the ranks holding the neighbouring virtual stages through
// Comm (wherever the schedule's placement puts them: round the ring of stages under the
// interleaved schedule, down and back up in a vee, where the turn is a message to this rank
// itself). Receives are posted two ahead into a small ring of buffers, so data arrives while this
// rank computes and a micro-batch's activations exist only from its forward to its backward,
// whatever the schedule; sends are nonblocking from a ring of buffers too.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "pipetrain/dist/comm.hpp"
#include "pipetrain/model/model.hpp"
#include "pipetrain/observe/trace.hpp"
#include "pipetrain/pipeline/device_staging.hpp"
#include "pipetrain/pipeline/expert_group.hpp"
#include "pipetrain/pipeline/message_rings.hpp"
#include "pipetrain/pipeline/tensor_group.hpp"
#include "pipetrain/schedule/actions.hpp"

namespace pipetrain {

struct StepStats {
  double compute_s = 0;       // forward + backward (incl. recompute) time
  double compute_cpu_s = 0;   // the same passes' CPU time (this thread's), when asked for (Executor::time_cpu)
  double wait_s = 0;          // time blocked on pipeline peers
  double loss_sum = 0;        // summed token loss over this rank's micro-batches (last stage)
  size_t act_peak_bytes = 0;  // peak of activations held between forward and backward
  size_t p2p_bytes = 0;       // pipeline messages sent to another rank: activations and gradients, not their stamps
  // By sending stage (never this rank's own): how long each message this rank had to wait for
  // took to come, from when it could first travel (sent, and its receive posted) to its arrival.
  // Messages that arrived while the rank computed are left out: their arrival time is unknown,
  // and a link nobody waits on costs the step nothing.
  std::map<int, std::vector<double>> transfer_s;
};

class Executor {
 public:
  // Runs steps of `shape` (micro-batches, virtual stages) on this rank's stage, giving the stage
  // its tensor group's collectives over `comm` (their spans go into the pass's trace).
  Executor(Stage& stage, Comm& comm, const StepShape& shape);
  // `load_inputs(mb)` sets tokens (first virtual stage) / targets (last) of micro-batch mb on the
  // stage; it is called just before that micro-batch's forward there. A micro-batch the list
  // never runs backward for (forward_only lists: evaluation) is dropped right after its forward. Spans go to `trace`
  // while it is recording. `grads_done_from` is handed to each chunk's last backward (when the chunks finish from the
  // last to the first, as the buffers are laid out), so gradient all-reduces can start while the step still runs (see
  // Stage::backward). `params_needed(chunk)` is called before each forward of a chunk (ZeRO-1 waits there for that
  // chunk's updated weights; true if it waited).
  StepStats run(const ActionList& actions, Trace& trace, const std::function<void(int)>& load_inputs,
                const std::function<void(size_t)>& grads_done_from = nullptr,
                const std::function<bool(int)>& params_needed = nullptr);

  // The largest message tag a step of `shape` uses (it must fit below World::max_tag()).
  static int64_t max_tag(const StepShape& shape) { return MessageLinks::max_tag(shape); }
  // How world rank 0's clock reads against this rank's now_s() (Comm::clock_offset_to_root):
  // every message carries its send time on rank 0's clock, so the receiver can time its travel.
  void set_clock_offset(double offset_s) { clock_offset_s_ = offset_s; }
  // Also time the passes in CPU time (StepStats::compute_cpu_s): two system calls per pass, so only
  // when straggler detection compares CPU time (ranks outnumbering cores).
  void time_cpu(bool on) { time_cpu_ = on; }

 private:
  struct Step;  // what one run() carries from action to action
  // One handler per operation (kHandlers in executor.cpp, in Op's order).
  void recv_act(Step& s, const Action& a);
  void forward(Step& s, const Action& a);
  void send_act(Step& s, const Action& a);
  void recv_grad(Step& s, const Action& a);
  void backward(Step& s, const Action& a);  // also backward_input
  void send_grad(Step& s, const Action& a);
  void backward_weight(Step& s, const Action& a);
  // Runs `pass` (returning the seconds it spent recomputing first) as one timed pass of `a`.
  template <class Pass>
  void timed_pass(Step& s, const Action& a, const char* category, Pass&& pass);
  // Activation bytes held, counted from the stage's buffers after every change.
  void count_held(Step& s, const Action& a);
  void count_sent(StepStats& stats, const SendRing& ring) const;  // StepStats::p2p_bytes

  Stage& stage_;
  Comm& comm_;
  CommTensorGroup tensor_group_;  // the stage's tensor-group collectives
  CommExpertGroup expert_group_;  // its expert group's all-to-alls
  StepShape shape_;
  MessageLinks links_;
  DeviceStaging staging_;
  double clock_offset_s_ = 0;
  bool time_cpu_ = false;
};

}  // namespace pipetrain
