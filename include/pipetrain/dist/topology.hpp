// Where a rank sits in the tp x pp x dp grid. Pure arithmetic, no MPI, so `plan` and tests can use it.
//
// Tensor-parallel ranks vary fastest: the tp ranks of one (stage, replica) are consecutive, so a
// tensor group, whose collectives run inside every block, shares a node. Above them, the rank
// order (parallel.order) decides what else shares a node when a launcher fills nodes with
// consecutive ranks (Slurm's block distribution, mpiexec's default); with g = world rank / tp:
//   "pp" (default): g = dp_rank * pp + stage. The P stages of one replica are
//        consecutive: pipeline p2p (every micro-batch, both directions) stays inside a node.
//   "dp": g = stage * dp + dp_rank. The D replicas of a stage are consecutive: the
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
  int tp = 1, tp_rank = 0;  // the tensor group: the ranks that split each of this stage's matrices
  RankOrder order = RankOrder::pp;
  // The stage holding the LM head: the last, or the first when the schedule lays its chunks in a
  // vee (schedule/placement.hpp), where the first stage holds both ends of the model.
  bool head_on_first = false;
  // Expert parallelism (parallel.ep): ep consecutive replicas of a stage split its experts, rank
  // dp_rank % ep of the group holding the ep-th part; the replicas holding the same part (one per
  // group) keep them in step as the data group does the rest.
  int ep = 1;
  int ep_rank() const { return dp_rank % ep; }
  int expert_replica() const { return dp_rank / ep; }  // which of the expert_replicas() this rank is
  int expert_replicas() const { return dp / ep; }

  static Topology of(int world_rank, int pp, int dp, RankOrder order = RankOrder::pp, bool head_on_first = false,
                     int tp = 1) {
    const bool by_replica = order == RankOrder::dp;
    const int g = world_rank / tp;  // the (stage, replica) cell
    return Topology{pp,
                    dp,
                    world_rank,
                    by_replica ? g / dp : g % pp,
                    by_replica ? g % dp : g / pp,
                    tp,
                    world_rank % tp,
                    order,
                    head_on_first};
  }
  // The world rank at (stage, replica, tensor rank); without the last, this rank's tensor rank.
  int rank_of(int stage_index, int replica, int tensor_rank) const {
    return tp * (order == RankOrder::dp ? stage_index * dp + replica : replica * pp + stage_index) + tensor_rank;
  }
  int rank_of(int stage_index, int replica) const { return rank_of(stage_index, replica, tp_rank); }
  int world_size() const { return tp * pp * dp; }
  // The stage's first rank (first replica, first tensor rank): it speaks for the stage's files.
  bool leads_stage() const { return dp_rank == 0 && tp_rank == 0; }
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
