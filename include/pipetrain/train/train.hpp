// `pipetrain train`: start-up checks agreed by all ranks, then the training loop.
#pragma once
#include <string>
#include <vector>

namespace pipetrain {

struct TrainOptions {
  std::string config;                 // empty: built-in defaults
  std::vector<std::string> overrides; // --set section.key=value
  std::string run_dir;                // empty: run.out_dir/run.name
  std::string resume = "auto";        // auto | never | PATH of a checkpoint directory
  bool eval_only = false;             // pipetrain eval: load `resume` (a PATH), print the validation
                                      // loss, write nothing; no config = the checkpoint's own spec
};

// Returns the process exit code (0 ok, 2 bad input, 3 stopped by a signal after a successful
// checkpoint); may throw AgreedExit. MPI must be initialised.
int run_train(const TrainOptions& opt);

}  // namespace pipetrain
