// The report's straggler section: from the straggler windows in metrics.jsonl (the "window" and
// "stragglers" keys, observe/stragglers.hpp), a table per rank and per node of median compute and
// wait per step and their ratio to peers, the slowest links, the slowest rank and node, what was
// flagged when, and the time the job lost to stragglers.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace pipetrain {

struct StragglerReport {
  std::string text;     // "" when the log holds no window
  nlohmann::json json;  // the same figures (null when none)
};

// `lines`: metrics.jsonl records of one layout, in order; `ratio`: log.straggler_ratio.
//
// Time lost: in a window, each rank over the ratio computed (compute - what its peers suggest) more
// per step; the step waits for the slowest of them, so the largest excess per step, times the
// window's steps, is what the job would have saved had every rank run at its peers' median.
StragglerReport straggler_report(const std::vector<nlohmann::json>& lines, double ratio);

// The time lost in one window (a metrics line's "window"), as above.
double window_lost_s(const nlohmann::json& window, double ratio);

}  // namespace pipetrain
