// `pipetrain report RUN_DIR [--plots DIR] [--json]`: what a finished or killed run did
// (tools/run_summary.hpp gathers it from the run directory's files), rendered as text or, with
// --json, as one JSON document of the same facts for scripts. Plots are drawn by
// scripts/analysis/plots.py (matplotlib), started with an argument vector, only when asked for, so
// the C++ side never needs Python.
#pragma once
#include <string>
#include <vector>

#include "pipetrain/util/errors.hpp"

namespace pipetrain {

// Returns ok when a report was printed, fault when plotting failed; throws SpecError when RUN_DIR
// holds nothing to report on or --plots names a folder it may not replace.
ExitCode run_report(const std::string& run_dir, const std::string& plots_dir, bool as_json = false);

// `pipetrain report RUN_DIR ...`: args are the words after the command.
ExitCode report_command(const std::vector<std::string>& args);

}  // namespace pipetrain
