// `pipetrain smoke`: a health check of a fresh allocation in well under a minute, run under srun
// or mpiexec with the ranks a real job would use. Every rank reports where it runs; every
// pipeline link is timed (latency, bandwidth); every data group's all-reduce is timed; each
// stage's replicas write, read back and verify a parallel HDF5 shard in the checkpoint directory;
// a 3-step tiny training must lower the loss. Rank 0 prints a table and PASS/FAIL naming the
// failing rank, link or path; every rank exits 0 (pass) or 1 (fail).
#pragma once
#include <string>
#include <vector>

#include "pipetrain/dist/world.hpp"

namespace pipetrain {

struct SmokeOptions {
  std::string config;                  // empty: built-in defaults
  std::vector<std::string> overrides;  // --set
  std::string run_dir;                 // where the checkpoint and training checks write (default run.out_dir/smoke)
};

ExitCode run_smoke(const SmokeOptions& opt, World& world);

// `pipetrain smoke ...`: args are the words after the command.
ExitCode smoke_command(const std::vector<std::string>& args);

}  // namespace pipetrain
