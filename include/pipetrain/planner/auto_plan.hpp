// `pipetrain plan --auto`: the layout to run. Every layout of `world` ranks (pp x dp, micro-batches,
// schedule, virtual stages, recompute, partition, zero) the spec's model allows is planned; those
// over the memory budget are dropped, the rest ranked by the step time predicted with the
// machine's costs (planner/step_time.hpp).
#pragma once
#include <string>
#include <vector>

#include "pipetrain/config/spec.hpp"
#include "pipetrain/planner/costs.hpp"
#include "pipetrain/planner/step_time.hpp"

namespace pipetrain {

struct LayoutChoice {
  RunSpec spec;  // the spec with this layout
  StepPrediction predicted;
  double memory_bytes;  // the fullest rank's
  std::string sets;     // "--set parallel.pp=2 --set ...": the line that runs it
  std::string summary;  // "pp 2 x dp 1, M 8, zb-v (2 chunks), recompute none, balanced, zero 0"
};

struct AutoPlan {
  std::vector<LayoutChoice> best;  // fastest first
  int considered = 0, over_memory = 0;
};

// `memory_per_rank` 0: no budget. Keeps the `keep` fastest.
AutoPlan auto_plan(const RunSpec& spec, int world, const MachineCosts& costs, double memory_per_rank, int keep = 5);
std::string auto_plan_text(const AutoPlan& plan, int world, const MachineCosts& costs, double memory_per_rank);
std::string auto_plan_json(const AutoPlan& plan, int world, const MachineCosts& costs, double memory_per_rank);

}  // namespace pipetrain
