// `pipetrain report RUN_DIR [--plots DIR] [--json]`: what a finished or killed run did, from its
// files alone (config.toml, metrics.jsonl, events.jsonl, checkpoints/, trace.json), next to what
// plan predicts, with its launches, idle time, recomputed steps and goodput; says what is missing
// instead of failing. --json prints the same figures as one JSON document for scripts. Plots are drawn by scripts/analysis/plots.py (matplotlib) only when
// asked for, so the C++ side never needs Python.
#pragma once
#include <string>

#include "pipetrain/util/errors.hpp"

namespace pipetrain {

// Returns the exit code: 0 when a report was printed, 2 when RUN_DIR holds nothing to report on.
ExitCode run_report(const std::string& run_dir, const std::string& plots_dir, bool as_json = false);

}  // namespace pipetrain
