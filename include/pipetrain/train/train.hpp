// `pipetrain train`: start-up checks agreed by all ranks, then the training loop.
#pragma once
#include <string>
#include <vector>

#include "pipetrain/ckpt/resume.hpp"
#include "pipetrain/dist/world.hpp"

namespace pipetrain {

struct TrainOptions {
  std::string config;                  // empty: built-in defaults
  std::vector<std::string> overrides;  // --set section.key=value
  std::string run_dir;                 // empty: run.out_dir/run.name
  ResumeFrom resume;                   // --resume auto (default) | never | PATH: a checkpoint or a run directory
  bool eval_only = false;              // pipetrain eval: load `resume` (a path), print the validation
                                       // loss, write nothing; no config = the checkpoint's own spec
  int eval_batches = 0;                // eval --batches N (0: eval.batches)
  // An in-process restart's (log.straggler_action = rebalance): overrides applied after everything
  // else (parallel.auto's choice too), and the start line that says why.
  std::vector<std::string> restart_overrides;
  std::string restart_note;
};

// Trains (or evaluates) on `world`: ok when the run is complete, stopped after a stop signal or
// the time budget (a checkpoint was saved), bad_input, or fault; may throw AgreedExit.
ExitCode run_train(const TrainOptions& opt, World& world);

}  // namespace pipetrain
