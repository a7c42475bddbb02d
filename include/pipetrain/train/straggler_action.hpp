// log.straggler_action: what rank 0 makes of the straggler detector's verdict at each closed window.
//
//   log        names stragglers (observe/stragglers.hpp) and does nothing else.
//   exclude    a node over the ratio in log.straggler_act_after windows in a row: the run
//              checkpoints and stops (exit 3), its stop record naming the node, for the job script
//              to requeue without it (jobs/train.sbatch). Only where the launcher says it can spare
//              that many nodes (LaunchInfo::spare_nodes); otherwise it says once why not.
//   rebalance  a rank over the ratio in act_after windows in a row: the partition is re-solved
//              from each stage's measured speed (its slowest rank's seconds per unit of the cost
//              model's work), and where that predicts the slowest stage at least kMinGain faster,
//              the run checkpoints and restarts in-process on it (train.cpp).
#pragma once
#include <set>
#include <string>
#include <vector>

#include "pipetrain/config/spec.hpp"
#include "pipetrain/observe/stragglers.hpp"

namespace pipetrain {

struct StragglerMove {
  StragglerAction kind = StragglerAction::log;  // log: nothing to do
  std::vector<std::string> nodes;               // exclude: the nodes to requeue without
  std::vector<int> blocks;                      // rebalance: the partition to restart on
  std::string why;                              // one line: the progress output and the stop record
};

class StragglerPolicy {
 public:
  // A rebalance must predict the slowest stage this much faster: below it the restart and the
  // measurement's noise cost more than it gains.
  static constexpr double kMinGain = 1.1;

  // `blocks`: the run's partition; `spare_nodes`: what the launcher can requeue without (-1: unknown).
  StragglerPolicy(const RunSpec& spec, std::vector<int> blocks, int spare_nodes);

  // After detector.observe(): the move to make now (kind log: none). A move not made is said in
  // `lines` once.
  StragglerMove after_window(const StragglerDetector& detector, std::vector<std::string>& lines);

  // The partition that balances the stages' measured speeds, and the slowest stage's predicted
  // time on the current partition over that on the new one (per rank: seconds per unit of its
  // stage's cost share, as StragglerDetector::per_work_s gives them).
  struct Rebalance {
    std::vector<int> blocks;
    double gain = 1;
  };
  Rebalance rebalanced(const std::vector<RankPlace>& places, const std::vector<double>& per_work_s) const;

 private:
  StragglerMove exclude(const StragglerDetector& detector, std::vector<std::string>& lines);
  StragglerMove rebalance(const StragglerDetector& detector, std::vector<std::string>& lines);
  void say_once(const std::string& line, std::vector<std::string>& lines);

  RunSpec spec_;  // a copy: the policy may outlive the spec it was made from
  std::vector<int> blocks_;
  int spare_nodes_;
  std::set<std::string> said_;
};

// "[1, 3]": a partition as parallel.partition spells it.
std::string blocks_text(const std::vector<int>& blocks);

}  // namespace pipetrain
