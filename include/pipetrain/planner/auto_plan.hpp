// `pipetrain plan --auto`: the layout to run. Every layout of `world` ranks (tp x pp x dp,
// micro-batches, schedule, virtual stages, recompute, partition, zero; with `search_batch` the
// global batch too: the spec's times 1, 2, 4, 8 and 16) the spec's model allows is planned; those
// over the memory budget are dropped, the rest ranked by the tokens per second predicted with the
// machine's costs (planner/step_time.hpp). A tensor group shares a node: tp is at most
// kMaxTensorRanks, and at most the ranks a node runs where that is known. The search also says what binds: why grids of
// `world` ranks were refused (too many stages for the layers, too many replicas for the global batch, a tp the heads do
// not allow, memory) and, for the best layout, whether the global batch per replica limits it and what half the ranks
// would reach.
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

constexpr int kMaxTensorRanks = 8;

// Grids (tp x pp x dp = world) refused before any layout was planned, by the first reason found.
struct GridRefusals {
  int grids = 0;   // tp x pp x dp factorisations of the world tried
  int layers = 0;  // pp above model.n_layer
  int batch = 0;   // dp not dividing the global batch (every global batch searched)
  int heads = 0;   // tp that the heads or the MLP's width do not divide, or above max_tp (a node)
  int memory = 0;  // every layout of the grid over the memory budget
};

struct AutoPlan {
  int max_tp = kMaxTensorRanks;    // the largest tensor group searched: what a node holds
  std::vector<LayoutChoice> best;  // fastest first
  int considered = 0, over_memory = 0;
  GridRefusals refused;
  std::vector<int> global_batches;  // searched
  double least_memory = 0;          // the least any layout considered needs (its fullest rank)
  std::string least_memory_layout;
  double least_memory_tp1 = 0;  // the same among the layouts without tensor parallelism
  std::string least_memory_tp1_layout;
  std::vector<std::string> binding;  // what binds, and what to change: one line each
};

// `memory_per_rank` 0: no budget. Keeps the `keep` fastest. `max_tp`: the ranks of a node, where
// fewer than kMaxTensorRanks.
AutoPlan auto_plan(const RunSpec& spec, int world, const MachineCosts& costs, double memory_per_rank, int keep = 5,
                   bool search_batch = false, int max_tp = kMaxTensorRanks);
// Adds the `scaling:` line to plan.binding: its best layout's tokens/s against the best of half the
// ranks (an even world). A second search as large as the first: plan --auto's report asks for it,
// parallel.auto's start-up and the node-count table do not.
void add_scaling_line(AutoPlan& plan, const RunSpec& spec, int world, const MachineCosts& costs, double memory_per_rank,
                      bool search_batch);
std::string auto_plan_text(const AutoPlan& plan, int world, const MachineCosts& costs, double memory_per_rank);
std::string auto_plan_json(const AutoPlan& plan, int world, const MachineCosts& costs, double memory_per_rank);

}  // namespace pipetrain
