// Where a rank sits in the pp x dp grid. Pure arithmetic, no MPI, so `plan` and tests can use it.
//
// Rank order: world rank = dp_rank * pp + stage. The P stages of one replica are consecutive ranks
// (one pipeline fills a node first under block placement), the D replicas of a stage are P apart.
#pragma once

namespace pipetrain {

struct Topology {
  int pp = 1, dp = 1;
  int world_rank = 0;
  int stage = 0, dp_rank = 0;

  static Topology of(int world_rank, int pp, int dp) {
    return Topology{pp, dp, world_rank, world_rank % pp, world_rank / pp};
  }
  static int rank_of(int stage, int dp_rank, int pp) { return dp_rank * pp + stage; }
  bool first_stage() const { return stage == 0; }
  bool last_stage() const { return stage == pp - 1; }
};

}  // namespace pipetrain
