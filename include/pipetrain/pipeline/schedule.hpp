// A schedule is data: for each stage, the ordered list of actions it performs in one step.
// Generators (GPipe, 1F1B, interleaved 1F1B, ZB-H1) only build lists; one executor runs any list.
//
// Under the interleaved schedule each rank owns V chunks of blocks: virtual stage v = chunk * P +
// stage (Megatron's assignment), so a micro-batch goes round the ring of ranks V times, rank P-1's
// chunk c sending on to rank 0's chunk c+1. Every other schedule has one chunk per rank (V = 1).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace pipetrain {

// backward is a fused backward; backward_input (B) and backward_weight (W) are its two halves,
// which zero-bubble schedules run apart so W can fill what would be bubbles.
enum class Op { recv_act, forward, send_act, recv_grad, backward, send_grad, backward_input, backward_weight };

struct Action {
  Op op;
  int mb;         // micro-batch index
  int chunk = 0;  // which of the rank's model chunks (interleaved; 0 otherwise)
  bool operator==(const Action& o) const { return op == o.op && mb == o.mb && chunk == o.chunk; }
};
using ActionList = std::vector<Action>;

// GPipe: all M forwards (receiving from stage-1 and sending to stage+1 as needed), then all M
// backwards in reverse micro-batch order, as in the seed's diagram (F0..F3 then B3..B0).
ActionList gpipe_schedule(int stage, int n_stages, int micro_batches);

// 1F1B (PipeDream-Flush): P-1-stage forwards to fill the pipeline, then one forward and one
// backward alternately, then the remaining backwards. Same bubble as GPipe, but a stage holds
// the activations of at most P - stage micro-batches instead of M.
ActionList one_f_one_b_schedule(int stage, int n_stages, int micro_batches);

// Interleaved 1F1B (Narayanan et al. 2021, as in Megatron-LM): each rank runs its V chunks on
// groups of P micro-batches (chunk 0 on micro-batches 0..P-1, chunk 1 on the same, ..., then the
// next group), 1F1B after a warm-up of 2(P-1-stage) + (V-1)P chunk-forwards; backwards visit the
// chunks in reverse. Needs M a multiple of P. Bubble (P-1)/(VM+P-1), V times less idle time than
// 1F1B's, for more activations: stage 0 holds P + (P-1)/V stages' worth (1F1B: P).
ActionList interleaved_schedule(int stage, int n_stages, int micro_batches, int chunks);

// ZB-H1-style zero bubble ("Zero Bubble Pipeline Parallelism", Qi et al. 2023): backward split
// into B (input gradient, sent upstream at once) and W (parameter gradient), listed by scheduling
// unit costs F = B = W greedily on all stages together: B first, then F while the stage holds
// fewer than P - stage micro-batches (1F1B's count; a micro-batch is held until its W), then a
// pending W where the stage would otherwise wait. With unit costs at P = 4, M = 8 the step takes
// 30 slots against 1F1B's 33 (the paper's hand-made H1, counting memory differently: 27).
ActionList zb_h1_schedule(int stage, int n_stages, int micro_batches);

// The schedule named by parallel.schedule: "gpipe", "1f1b", "interleaved" (with `chunks` = V) or
// "zb-h1".
ActionList make_schedule(const std::string& name, int stage, int n_stages, int micro_batches, int chunks = 1);

// The forwards of a list alone (with their receives and sends), in the list's order: what an
// evaluation runs; the executor drops each micro-batch's activations right after its forward.
ActionList forward_only(const ActionList& list);

// The bubble a schedule has when every stage's forward and backward cost the same: GPipe's and
// 1F1B's closed form (P-1)/(M+P-1), interleaved's (P-1)/(VM+P-1); zb-h1's from its lists with
// F = B = W (its paper's unit).
double schedule_bubble(const std::string& name, int n_stages, int micro_batches, int chunks = 1);

// Most (chunk, micro-batch) pairs whose forward has run and whose parameter gradients are not yet
// done: the activations a stage holds at its peak under this list (M for GPipe, min(M, P - stage)
// for 1F1B; counted in chunks for interleaved).
int max_in_flight(const ActionList& list);

// Peak bytes a stage holds under this list when a micro-batch keeps stash[chunk] bytes from its
// forward to the end of its backward, plus wgrads[chunk] bytes from a split B to its W.
size_t peak_activation_bytes(const ActionList& list, const std::vector<size_t>& stash, const std::vector<size_t>& wgrads);

// "F3", "B0", "recvA2", ...; chunks after the first get a suffix: "F3.1" is chunk 1's forward.
std::string to_string(const Action& a);

// Outgoing messages a rank may have in flight per direction: the executor's send and receive rings
// hold this many, so a send of its k-th message waits until the receiver has taken message
// k - kMessageRing - 1 (with rendezvous transfers, sends complete only into a posted receive).
constexpr int kMessageRing = 2;

// One step of every stage's action list, simulated: virtual stage v (= chunk * P + stage; the
// stage itself when V = 1) spends fwd[v] per forward and bwd[v] per backward, of which a split
// backward's W takes wgt[v] (default bwd/2) and its B the rest; so the cost vectors have P * V
// entries. Messages take no time; a receive waits for its matching send, and a forward or backward
// whose result goes to a peer waits, as the executor does, until that peer has room for it
// (kMessageRing). This is the prediction `plan` prints; with unit costs it is the seed's diagram.
struct SimSpan {
  double start, end;
  Action action;  // forward or backward
};
struct SimResult {
  double makespan = 0;
  std::vector<double> busy;                  // compute time per stage
  std::vector<double> bubble;                // 1 - busy / makespan, per stage
  std::vector<std::vector<SimSpan>> spans;   // per stage, in time order
  double mean_bubble() const;
};
// Throws std::logic_error if the lists deadlock (a receive whose send never happens, or sends
// that outrun the receiver's buffers while it waits on the sender).
SimResult simulate(const std::vector<ActionList>& lists, const std::vector<double>& fwd, const std::vector<double>& bwd,
                   const std::vector<double>& wgt = {});

// The seed's chart: a header of time slots, then one row per stage with F<mb>/B<mb> or '·' per
// unit slot. Needs a simulation with unit-multiple costs; returns "" if wider than max_slots.
std::string render_chart(const SimResult& sim, int max_slots = 64);

}  // namespace pipetrain
