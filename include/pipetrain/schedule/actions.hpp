// A schedule is data: for each stage, the ordered list of actions it performs in one step. The
// generators (schedule/generators.hpp) only build these lists; one executor runs any list, and the
// simulator (schedule/simulate.hpp) predicts how long a set of lists takes.
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

// The forwards of a list alone (with their receives and sends), in the list's order: what an
// evaluation runs; the executor drops each micro-batch's activations right after its forward.
ActionList forward_only(const ActionList& list);

// Most (chunk, micro-batch) pairs whose forward has run and whose parameter gradients are not yet
// done: the activations a stage holds at its peak under this list (M for GPipe, min(M, P - stage)
// for 1F1B, min(M, P) for zb-h1; counted in chunks for interleaved).
int max_in_flight(const ActionList& list);

// Peak bytes a stage holds under this list when a micro-batch keeps stash[chunk] bytes from its
// forward to the end of its backward, plus wgrads[chunk] bytes from a split B to its W.
size_t peak_activation_bytes(const ActionList& list, const std::vector<size_t>& stash,
                             const std::vector<size_t>& wgrads);

// Bytes a stage keeps allocated under this list: its buffers are reused, never given back, from
// pools shared by chunks of one shape (pool_of_chunk), activations and split-backward gradients
// in separate pools; so it holds, per pool, the most entries ever live in it at once, each of its
// chunks' size. At least peak_activation_bytes; equal when one pool's peaks coincide.
size_t held_activation_bytes(const ActionList& list, const std::vector<size_t>& stash,
                             const std::vector<size_t>& wgrads, const std::vector<int>& pool_of_chunk);

// "F3", "B0", "recvA2", ...; chunks after the first get a suffix: "F3.1" is chunk 1's forward.
std::string to_string(const Action& a);

// Messages a rank may have in flight on one link (activations or gradients, to or from one peer:
// schedule/placement.hpp): the executor's send and receive rings hold this many, so a compute
// producing its k-th message on a link waits until message k - kMessageRing has completed, i.e.
// its receiver posted the receive, which it does kMessageRing ahead of the one it is using (with
// rendezvous transfers, sends complete only into a posted receive).
constexpr int kMessageRing = 2;

}  // namespace pipetrain
