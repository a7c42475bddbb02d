// `plan --auto` for the job a user submits: over a range of node counts (--nodes MIN-MAX with
// --ranks-per-node K, Slurm's own range), each size's best layout, its throughput and memory; and
// (--sbatch) the sbatch line that runs a pick: nodes, tasks per node, a time limit from the
// predicted run, and the spec overrides that give the layout.
#pragma once
#include <string>
#include <vector>

#include "pipetrain/planner/auto_plan.hpp"

namespace pipetrain {

struct NodeRange {
  int min = 0, max = 0;
};
// "4" or "2-8" (as sbatch --nodes takes it); SpecError naming --nodes otherwise.
NodeRange parse_node_range(const std::string& text);

struct SizePlan {
  int nodes = 0, ranks = 0;
  AutoPlan plan;
};
// plan --auto at every node count of `range`, K ranks each (a tensor group within a node: tp <= K).
std::vector<SizePlan> plan_sizes(const RunSpec& spec, NodeRange range, int ranks_per_node, const MachineCosts& costs,
                                 double memory_per_rank, bool search_batch);

// What a job needs: the spec file, the overrides the user gave, and K tasks per node.
struct JobRequest {
  std::string config;
  std::vector<std::string> overrides;
  int ranks_per_node = 0;
};
// The time limit asked of Slurm for a run predicted to train for `training_s`: a quarter more, plus
// 10 minutes for start-up, checkpoints and the evaluation, in whole minutes ("1:30:00",
// "2-04:00:00" past a day).
std::string slurm_time_limit(double training_s);
// "sbatch --nodes=N --ntasks-per-node=K --time=T jobs/train.sbatch --config C --set ...": the user's
// overrides first, then the layout's, each quoted for the shell where it needs to be.
std::string sbatch_line(const JobRequest& job, int nodes, const LayoutChoice& pick);

std::string sizes_text(const std::vector<SizePlan>& sizes, const RunSpec& spec, const MachineCosts& costs,
                       const JobRequest* sbatch);
std::string sizes_json(const std::vector<SizePlan>& sizes, const MachineCosts& costs, const JobRequest* sbatch);

}  // namespace pipetrain
