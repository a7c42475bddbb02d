// `pipetrain plan`: predictions without a launch (the planner, planner/), and `plan --calibrate`,
// which measures this machine's costs (tools/calibrate.hpp) or takes them from a finished run.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "pipetrain/dist/world.hpp"
#include "pipetrain/util/errors.hpp"

namespace pipetrain {

struct PlanOptions {
  std::string config;
  std::vector<std::string> overrides;
  int world = 0;                      // --world: ranks to plan for (0: pp x dp)
  bool json = false;                  // --json
  bool compare_schedules = false;     // --compare-schedules
  std::optional<int> ranks_per_node;  // --ranks-per-node
  bool automatic = false;             // --auto
  std::string global_batch;           // --global-batch: "auto" searches it with --auto
  std::string nodes;                  // --nodes: with --auto, node counts MIN-MAX (or one) to plan
  bool sbatch = false;                // --sbatch: with --auto, the sbatch line of each pick
  std::string costs;                  // --costs: a cost file or a run directory
  std::optional<double> peak_tflops;  // --peak-tflops, --link-gbps, --efficiency: a machine not at hand
  std::optional<double> link_gbps;
  std::optional<double> node_link_gbps;  // a tensor group's link within a node (NVLink); unset: link_gbps
  double efficiency = 0.5;
  std::string memory_per_rank;  // --memory-per-rank, as given ("141GiB")
  // --calibrate: measure (or, with --from-run, read a run's trace) and write --output.
  bool calibrate = false;
  std::string from_run;
  std::string output = "costs.json";
  bool output_given = false;
  bool force = false;
};

// "80GiB", "141e9", "64 GB", "1048576": a byte count, else SpecError naming `option`.
double parse_bytes(const std::string& text, const std::string& option);

// The predictions, in one process (no MPI).
ExitCode run_plan(const PlanOptions& opt);
// plan --calibrate --from-run, in one process.
ExitCode run_calibrate_from_run(const PlanOptions& opt);
// plan --calibrate on every rank of `world`.
ExitCode run_calibrate(const PlanOptions& opt, World& world);

// `pipetrain plan ...`: its options parsed into PlanOptions, then one of the above.
ExitCode plan_command(const std::vector<std::string>& args);

}  // namespace pipetrain
