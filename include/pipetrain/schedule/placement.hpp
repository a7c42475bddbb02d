// Where a rank's model chunks sit along the pipeline. The model is cut into P x V chunks, virtual
// stages v = 0 .. PV-1 in model order (v = 0 holds the embeddings, v = PV-1 the LM head), laid on
// P ranks in one of two ways:
// - loop (Megatron's interleaved assignment; V = 1 is the plain pipeline): rank s holds
//   v = s, s + P, s + 2P, ...; a micro-batch goes round the ring of ranks V times, rank P-1
//   handing on to rank 0.
// - vee (the zig-zag of the V-shaped zero-bubble schedules): chunk c of rank s is v = cP + s for
//   even c and v = (c+1)P - 1 - s for odd c. With V = 2 rank s holds s and 2P-1-s: a micro-batch
//   goes down the ranks and back up, the turn at rank P-1 is a hand-off to itself, and rank 0
//   holds both ends of the model (embedding and head), so a tied embedding needs no exchange.
#pragma once
#include <set>
#include <tuple>

namespace pipetrain {

enum class Placement { loop, vee };

struct ChunkPlacement {
  int stages = 1, chunks = 1;
  Placement kind = Placement::loop;

  int virtual_stages() const { return stages * chunks; }
  int vstage(int stage, int chunk) const {
    return kind == Placement::vee && chunk % 2 ? (chunk + 1) * stages - 1 - stage : chunk * stages + stage;
  }
  int chunk_of(int vstage) const { return vstage / stages; }
  int stage_of(int vstage) const {
    const int c = vstage / stages, at = vstage % stages;
    return kind == Placement::vee && c % 2 ? stages - 1 - at : at;
  }
  // The rank holding the LM head (the last virtual stage): P-1 in a loop, 0 in a vee of 2 chunks.
  int head_stage() const { return stage_of(virtual_stages() - 1); }
};

// One way messages travel between a rank and a peer (possibly itself): activations or gradients,
// in or out. The executor keeps a ring of kMessageRing buffers per link, and the simulator
// models each link's ring, so a slow consumer on one side never holds up traffic to the other.
struct MessageLink {
  bool grad, in;
  int peer;
  bool operator<(const MessageLink& o) const { return std::tie(grad, in, peer) < std::tie(o.grad, o.in, o.peer); }
};

// The links rank `stage` uses: activations come from the previous virtual stage's rank and go to
// the next one's; gradients the other way.
inline std::set<MessageLink> message_links(const ChunkPlacement& p, int stage) {
  std::set<MessageLink> links;
  for (int c = 0; c < p.chunks; ++c) {
    const int v = p.vstage(stage, c);
    if (v > 0) {
      links.insert({false, true, p.stage_of(v - 1)});
      links.insert({true, false, p.stage_of(v - 1)});
    }
    if (v + 1 < p.virtual_stages()) {
      links.insert({false, false, p.stage_of(v + 1)});
      links.insert({true, true, p.stage_of(v + 1)});
    }
  }
  return links;
}

}  // namespace pipetrain
