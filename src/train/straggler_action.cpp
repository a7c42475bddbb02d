#include "pipetrain/train/straggler_action.hpp"

#include <algorithm>
#include <cstdio>

#include "pipetrain/model/partition.hpp"

namespace pipetrain {

std::string blocks_text(const std::vector<int>& blocks) {
  std::string s = "[";
  for (size_t i = 0; i < blocks.size(); ++i) s += (i ? ", " : "") + std::to_string(blocks[i]);
  return s + "]";
}

StragglerPolicy::StragglerPolicy(const RunSpec& spec, std::vector<int> blocks, int spare_nodes)
    : spec_(spec), blocks_(std::move(blocks)), spare_nodes_(spare_nodes) {}

void StragglerPolicy::say_once(const std::string& line, std::vector<std::string>& lines) {
  if (said_.insert(line).second) lines.push_back(line);
}

StragglerMove StragglerPolicy::after_window(const StragglerDetector& detector, std::vector<std::string>& lines) {
  switch (spec_.log.straggler_action) {
    case StragglerAction::exclude:
      return exclude(detector, lines);
    case StragglerAction::rebalance:
      return rebalance(detector, lines);
    default:
      return {};
  }
}

StragglerMove StragglerPolicy::exclude(const StragglerDetector& detector, std::vector<std::string>& lines) {
  const int k = spec_.log.straggler_act_after;
  std::vector<std::string> slow = detector.nodes_over(k);  // slowest first
  if (slow.empty()) return {};
  std::string named;
  for (const std::string& node : slow) named += (named.empty() ? "" : ", ") + node;
  const std::string head = "straggler action: node" + std::string(slow.size() > 1 ? "s " : " ") + named + " slow in " +
                           std::to_string(k) + " windows in a row";
  if (spare_nodes_ < 0) {
    say_once(head +
                 ", not excluded: the launcher does not say it can requeue without a node (PIPETRAIN_SPARE_NODES, "
                 "which jobs/train.sbatch sets)",
             lines);
    return {};
  }
  if (spare_nodes_ == 0) {
    say_once(head + ", not excluded: the job has no node to spare (its node range's minimum, no idle node)", lines);
    return {};
  }
  if (static_cast<int>(slow.size()) > spare_nodes_) slow.resize(spare_nodes_);
  StragglerMove move;
  move.kind = StragglerAction::exclude;
  move.nodes = slow;
  std::string excluded;
  for (const std::string& node : slow) excluded += (excluded.empty() ? "" : ", ") + node;
  move.why = head +
             " (log.straggler_action = exclude): checkpoint, then stop (exit 3) for the job to requeue "
             "without " +
             excluded;
  return move;
}

StragglerPolicy::Rebalance StragglerPolicy::rebalanced(const std::vector<RankPlace>& places,
                                                       const std::vector<double>& per_work_s) const {
  const int pp = spec_.parallel.pp;
  // Each stage runs at its slowest rank's speed: replicas meet at the gradient sum, tensor ranks in every layer.
  std::vector<double> stage_rate(pp, 0.0);
  for (size_t r = 0; r < places.size() && r < per_work_s.size(); ++r)
    stage_rate[places[r].stage] = std::max(stage_rate[places[r].stage], per_work_s[r]);
  Rebalance out{blocks_, 1.0};
  if (std::any_of(stage_rate.begin(), stage_rate.end(), [](double v) { return !(v > 0); })) return out;
  const ChunkPlacement placement = spec_.chunk_placement();
  // The slowest stage's predicted time on a partition: its chunks' cost shares at its rate.
  auto slowest = [&](const std::vector<int>& blocks) {
    const std::vector<double> costs = stage_costs(spec_, blocks);
    double total = 0;
    for (double c : costs) total += c;
    std::vector<double> time(pp, 0.0);
    for (size_t v = 0; v < costs.size(); ++v) {
      const int s = placement.stage_of(static_cast<int>(v));
      time[s] += stage_rate[s] * costs[v] / total;
    }
    return *std::max_element(time.begin(), time.end());
  };
  std::vector<double> chunk_rate;
  for (size_t v = 0; v < blocks_.size(); ++v) chunk_rate.push_back(stage_rate[placement.stage_of(static_cast<int>(v))]);
  out.blocks = balanced_blocks(spec_, chunk_rate);
  out.gain = slowest(blocks_) / slowest(out.blocks);
  return out;
}

StragglerMove StragglerPolicy::rebalance(const StragglerDetector& detector, std::vector<std::string>& lines) {
  const int k = spec_.log.straggler_act_after;
  if (!detector.rank_over(k)) return {};
  const Rebalance next = rebalanced(detector.places(), detector.per_work_s());
  char gain[64];
  std::snprintf(gain, sizeof gain, "%.0f%%", 100 * (next.gain - 1));
  const std::string head = "straggler action: a rank slow in " + std::to_string(k) + " windows in a row; ";
  if (next.blocks == blocks_ || next.gain < kMinGain) {
    say_once(head + "the partition " + blocks_text(blocks_) + " is kept: re-solved from the ranks' measured speed (" +
                 blocks_text(next.blocks) + ") it would make the slowest stage " + gain + " faster, under the " +
                 std::to_string(static_cast<int>(100 * (kMinGain - 1) + 0.5)) + "% a restart needs",
             lines);
    return {};
  }
  StragglerMove move;
  move.kind = StragglerAction::rebalance;
  move.blocks = next.blocks;
  move.why = head + "partition " + blocks_text(blocks_) + " -> " + blocks_text(next.blocks) +
             " (re-solved from the ranks' measured speed: the slowest stage " + gain +
             " faster; log.straggler_action = rebalance): checkpoint, then restart in-process on it";
  return move;
}

}  // namespace pipetrain
