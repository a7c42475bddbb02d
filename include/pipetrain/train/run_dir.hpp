// The run directory (RUN_DIR: config.toml, metrics.jsonl, trace.json, checkpoints/): made ready by
// rank 0 once every rank agreed the run can start, so a refused run never touches it.
#pragma once
#include <cstdint>
#include <string>

#include "pipetrain/ckpt/save.hpp"
#include "pipetrain/config/spec.hpp"
#include "pipetrain/observe/metrics.hpp"

namespace pipetrain {

// Where a run lives: the --run-dir given, else run.out_dir/run.name (what `train --print-run-dir`
// prints, for job scripts that read the run's checkpoints and logs).
std::string resolve_run_dir(const std::string& run_dir_option, const RunSpec& spec);

// Refuses (SpecError) a directory that exists, is not empty and holds nothing a pipetrain run
// writes (.lock, config.toml, metrics.jsonl, events.jsonl, checkpoints/): a --run-dir naming a
// folder of the user's own files would otherwise be trained into.
void check_run_dir_is_a_run(const std::string& dir);

// Creates the directory and writes the resolved spec (and tokenizer.model, the SentencePiece model
// of the run's token file, when it has one). Continuing this run's own history
// (resumed_step > 0 from its own checkpoints) keeps the log up to that step and sets aside newer
// checkpoints, whose steps are recomputed; otherwise (a fresh start, or a checkpoint of another
// run) an earlier log and checkpoints are moved aside, never deleted. Checks that checkpoints can
// be written. Returns a note on what it moved ("" if nothing); SpecError naming the path.
// `cut`: what a resume cut from the log (empty otherwise).
std::string prepare_run_dir(const std::string& dir, const RunSpec& spec, int64_t resumed_step,
                            Checkpointer& checkpointer, const std::string& tokenizer_model, CutLog* cut);

}  // namespace pipetrain
