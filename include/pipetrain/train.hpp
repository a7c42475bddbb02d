// `pipetrain train`: start-up checks agreed by all ranks, then the training loop.
#pragma once
#include <string>
#include <vector>

namespace pipetrain {

struct TrainOptions {
  std::string config;                 // empty: built-in defaults
  std::vector<std::string> overrides; // --set section.key=value
  std::string run_dir;                // empty: run.out_dir/run.name
};

// Returns the process exit code (0 ok, 2 bad input). MPI must be initialised.
int run_train(const TrainOptions& opt);

}  // namespace pipetrain
