// Where a rank sits in the pp x dp grid. Pure arithmetic, no MPI, so `plan` and tests can use it.
//
// Rank order (parallel.order), which decides what shares a node when a launcher fills nodes with
// consecutive ranks (Slurm's block distribution, mpiexec's default):
//   "pp" (default): world rank = dp_rank * pp + stage. The P stages of one replica are
//        consecutive: pipeline p2p (every micro-batch, both directions) stays inside a node.
//   "dp": world rank = stage * dp + dp_rank. The D replicas of a stage are consecutive: the
//        gradient all-reduce (once per step, the stage's parameters) stays inside a node.
#pragma once
#include <string>
#include <vector>

#include "pipetrain/config/choices.hpp"  // RankOrder

namespace pipetrain {

struct Topology {
  int pp = 1, dp = 1;
  int world_rank = 0;
  int stage = 0, dp_rank = 0;
  RankOrder order = RankOrder::pp;
  // The stage holding the LM head: the last, or the first when the schedule lays its chunks in a
  // vee (schedule/placement.hpp), where the first stage holds both ends of the model.
  bool head_on_first = false;

  static Topology of(int world_rank, int pp, int dp, RankOrder order = RankOrder::pp, bool head_on_first = false) {
    const bool by_replica = order == RankOrder::dp;
    return Topology{pp,
                    dp,
                    world_rank,
                    by_replica ? world_rank / dp : world_rank % pp,
                    by_replica ? world_rank % dp : world_rank / pp,
                    order,
                    head_on_first};
  }
  int rank_of(int stage_index, int replica) const {
    return order == RankOrder::dp ? stage_index * dp + replica : replica * pp + stage_index;
  }
  bool first_stage() const { return stage == 0; }
  bool last_stage() const { return stage == pp - 1; }
  int head_stage() const { return head_on_first ? 0 : pp - 1; }
  bool holds_head() const { return stage == head_stage(); }
  // A tied embedding's two halves sit on different stages and are summed between them.
  bool tied_apart() const { return head_stage() != 0; }
};

// Which node runs which (stage, replica), and which traffic crosses nodes: the pipeline links
// (stage s to s+1 of a replica) whose ends sit on different nodes, and the data groups (a
// stage's replicas) spread over several. `host_of_rank` holds each world rank's node name.
std::string node_map(const std::vector<std::string>& host_of_rank, const Topology& layout);
// A layout not launched yet, as launchers fill nodes: `ranks` consecutive ranks, `per_node` to a
// node named node0, node1, ... (what node_map takes for `plan --ranks-per-node`).
std::vector<std::string> nodes_filled_in_order(int ranks, int per_node);

}  // namespace pipetrain
