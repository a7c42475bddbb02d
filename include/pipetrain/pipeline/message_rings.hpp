// The executor's messages. Each link (schedule/placement.hpp: activations or gradients, in or out,
// with one peer) has a ring of kMessageRing buffers: receives are posted ahead into it in the order
// the action list consumes them, so data arrives while this rank computes; sends go out of it
// without blocking, a buffer reused once its send completed. Every message is one activation (or
// its gradient) followed by its send time on rank 0's clock, so the receiver can time its travel.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "pipetrain/config/spec.hpp"
#include "pipetrain/dist/comm.hpp"
#include "pipetrain/observe/trace.hpp"
#include "pipetrain/schedule/actions.hpp"
#include "pipetrain/schedule/placement.hpp"

namespace pipetrain {

// kMessageRing buffers of one message each and their requests, for the link with `peer`.
struct Ring {
  static constexpr size_t kStampFloats = 2;  // the send time: a double in two floats after the data
  int peer = -1;
  size_t floats = 0;  // of data, without the stamp
  std::vector<std::vector<float>> bufs;
  std::vector<Request> reqs;
  void open(int with, size_t data_floats);
};

struct RecvRing : Ring {
  std::vector<int> order;         // message tags in the order the list receives them
  std::vector<double> posted_at;  // per buffer: when its receive was posted (rank 0's clock)
  size_t posted = 0, used = 0;
  // Posts receives for the next messages in `order`, up to kMessageRing ahead of those used.
  void post(Comm& comm, double clock_offset_s);
  // The next message, in order; if it had not arrived yet, how long it travelled goes to `transfer_s`.
  float* wait(Comm& comm, const WaitLabel& label, double clock_offset_s, std::vector<double>& transfer_s);
};

// Each buffer remembers the message (tag) it holds, so a send action finds its data whatever the
// action order.
struct SendRing : Ring {
  std::vector<int> tag, mb;
  size_t next = 0;
  void open(int with, size_t data_floats);
  // The next buffer, once the earlier send from it completed (the wait traced), now holding `for_tag`.
  float* acquire(Comm& comm, int for_tag, int for_mb, const char* what, Trace& trace);
  // Sends the buffer holding `for_tag`, stamped with the time now.
  void send(Comm& comm, int for_tag, const Action& a, double clock_offset_s);
  // Waits for every send; no buffer holds a message afterwards.
  void drain(Comm& comm, const char* what);
};

// One rank's rings, and which of them an action's input or output travels on: the ranks holding
// the virtual stages before and after the action's chunk (round the ring of stages under the
// interleaved schedule, down and back up in a vee, where the turn is a message to this rank itself).
// Messages over the boundary between virtual stages v and v+1 carry tags 2(vM + mb) (activation)
// and 2(vM + mb) + 1 (gradient): unique within a step whatever order the schedule sends them in.
class MessageLinks {
 public:
  MessageLinks(const ChunkPlacement& placement, int stage, int micro_batches, size_t floats);

  int prev(const Action& a) const { return placement_.stage_of(vstage(a) - 1); }
  int next(const Action& a) const { return placement_.stage_of(vstage(a) + 1); }
  RecvRing& act_in(const Action& a) { return in_.at({false, true, prev(a)}); }
  RecvRing& grad_in(const Action& a) { return in_.at({true, true, next(a)}); }
  SendRing& act_out(const Action& a) { return out_.at({false, false, next(a)}); }
  SendRing& grad_out(const Action& a) { return out_.at({true, false, prev(a)}); }
  int act_in_tag(const Action& a) const { return act_tag(vstage(a) - 1, a.mb); }
  int act_out_tag(const Action& a) const { return act_tag(vstage(a), a.mb); }
  int grad_in_tag(const Action& a) const { return act_tag(vstage(a), a.mb) + 1; }
  int grad_out_tag(const Action& a) const { return act_tag(vstage(a) - 1, a.mb) + 1; }

  // A step's receives, in the order `actions` consumes them, the first kMessageRing of each link posted.
  void post_receives(const ActionList& actions, Comm& comm, double clock_offset_s);
  // One MPI_Test of every pending message (the stage's poll points, Stage::set_poll).
  void progress(Comm& comm);
  // Waits for every send of the step.
  void drain_sends(Comm& comm);
  // The largest message tag a step of `shape` uses.
  static int64_t max_tag(const StepShape& shape) {
    return 2 * (int64_t{shape.virtual_stages() - 1} * shape.micro_batches) - 1;  // the last boundary's last gradient
  }

 private:
  int vstage(const Action& a) const { return placement_.vstage(stage_, a.chunk); }
  int act_tag(int boundary, int mb) const { return 2 * (boundary * micro_batches_ + mb); }
  ChunkPlacement placement_;
  int stage_, micro_batches_;
  std::map<MessageLink, SendRing> out_;  // keyed by link (grad, in = false, peer)
  std::map<MessageLink, RecvRing> in_;   // (grad, in = true, peer)
};

}  // namespace pipetrain
