// The pipeline simulator: when each action of every stage's list would run, given per-stage costs.
// `plan` prints its prediction and its slot chart; the unit tests use it to prove every generator's
// lists free of deadlock.
#pragma once
#include <string>
#include <vector>

#include "pipetrain/schedule/actions.hpp"
#include "pipetrain/schedule/placement.hpp"

namespace pipetrain {

// One step of every stage's action list, simulated: virtual stage v (placed on the ranks by
// `placement`; the stage itself when V = 1) spends fwd[v] per forward and bwd[v] per backward, of
// which a split backward's W takes wgt[v] (default bwd/2) and its B the rest; so the cost vectors
// have P * V entries. A message between ranks takes message_s (0: none; a rank's message to itself
// is free), and the executor's message rings are modelled exactly: a rank posts its receives of each kind (activations,
// gradients) in list order, at most kMessageRing ahead of the one it is using, and a forward or backward whose result
// goes to a peer first waits until the send kMessageRing earlier from the same ring has completed, i.e. its receiver
// had posted the receive (a rendezvous transfer). This is the prediction `plan` prints; with unit costs it is the
// classic GPipe slot diagram (stages x time slots).
struct SimSpan {
  double start, end;
  Action action;  // forward or backward
};
struct SimResult {
  double makespan = 0;
  std::vector<double> busy;                 // compute time per stage
  std::vector<double> bubble;               // 1 - busy / makespan, per stage
  std::vector<std::vector<SimSpan>> spans;  // per stage, in time order
  double mean_bubble() const;
};
// Throws std::logic_error if the lists deadlock (a receive whose send never happens, or sends
// that outrun the receiver's buffers while it waits on the sender).
SimResult simulate(const std::vector<ActionList>& lists, const std::vector<double>& fwd, const std::vector<double>& bwd,
                   const std::vector<double>& wgt = {}, Placement placement = Placement::loop, double message_s = 0);

// The slot chart: a header of time slots, then one row per stage with F<mb>/B<mb> or '·' per
// unit slot. Needs a simulation with unit-multiple costs; returns "" if wider than max_slots.
std::string render_chart(const SimResult& sim, int max_slots = 64);

}  // namespace pipetrain
