// parallel.auto = true: every launch lays the run out on the ranks it was given, as plan --auto
// would (planner/auto_plan.hpp): every tp x pp x dp of them (a tensor group within a node),
// micro-batches, schedule, chunks, recompute, partition, zero and ep, within each rank's share of
// its node's memory (its GPU's), ranked by the tokens/s predicted from the run's own costs. Those
// are measured at the run's first launch on its own ranks (plan --calibrate's measurement) and
// kept in RUN_DIR/costs.json, so a later launch on more or fewer ranks chooses from the same
// figures. The global batch and everything else that changes the numbers stay the spec's; the
// checkpoints resume on whatever layout is chosen. A layout key the file or a --set gives is
// replaced by the choice, and the start lines say so (a config laid out for a fixed launch runs
// with --set parallel.auto=true as it is).
#pragma once
#include <string>
#include <vector>

#include "pipetrain/config/spec.hpp"
#include "pipetrain/dist/world.hpp"

namespace pipetrain {

// What parallel.auto chooses.
extern const std::vector<std::string> kAutoLayoutKeys;

struct AutoLayout {
  int ranks = 0;
  std::vector<std::string> overrides;  // "parallel.tp=1", ...: read after the spec's own
  std::string summary;                 // "pp 2 x dp 2, M 4, 1f1b, recompute none, balanced, zero 1"
  std::string reason;                  // why: the search, the prediction, the memory
  bool measured = false;               // the costs were measured at this launch (else RUN_DIR/costs.json's)
  std::string costs_json;              // the costs chosen with, for RUN_DIR/costs.json (rank 0)
};

// Every rank calls it, with the spec read on any layout: rank 0 reads RUN_DIR/costs.json (else
// every rank measures the costs), searches the layouts and tells every rank its choice. Throws
// SpecError on every rank when no layout of the ranks fits, with what binds.
AutoLayout choose_layout(const RunSpec& spec, World& world, const std::string& run_dir);

// The spec read with the choice's overrides: each chosen key's origin names parallel.auto, and a
// note names each one `as_given` (the spec before the choice) set to another value, and where.
void credit_auto_layout(RunSpec& spec, const RunSpec& as_given, const AutoLayout& pick);

}  // namespace pipetrain
