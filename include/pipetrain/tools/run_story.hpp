// A run's story across its launches, from RUN_DIR/events.jsonl and metrics.jsonl alone: when each
// launch ran, on which layout and job, where it resumed, how it ended, how long the run sat idle
// between launches, which steps were computed twice, and the goodput: useful steps x the ideal
// step time / the wall time from the first launch's start to the last one's end. For `report`.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace pipetrain {

struct LaunchStory {
  int launch = 0;
  double start = 0, end = 0;              // Unix seconds: the launch record; the stop record or its last logged step
  std::string job_id, layout;             // "" when not under Slurm; "pp 2 x dp 2"
  int64_t resumed_from = -1;              // -1: a fresh start
  int64_t first_step = 0, last_step = 0;  // logged by this launch (0: none)
  std::string ended;                      // the stop reason, or "no stop record" (a fault, a kill, a lost node)
  std::string acted;                      // a straggler stop's: "without node2", "partition [2, 2] -> [3, 1]"
  int exit_code = -1;                     // -1: not recorded
  int64_t recomputed = 0;                 // steps the launch before had logged beyond this one's resume step
  double idle_before = 0;                 // seconds since the launch before ended (0 for the first)
  int ranks_per_node = 0, threads_per_rank = 0, node_cores = 0;  // 0: not recorded
  int ranks = 0;                                                 // 0: not recorded
  std::string chosen_because;  // parallel.auto chose the layout: why ("" where the spec gave it)
  // More compute threads than cores on a node: a rank waiting for a core shows up as bubble.
  bool oversubscribed() const { return node_cores > 0 && ranks_per_node * threads_per_rank > node_cores; }
};

struct RunStory {
  std::vector<LaunchStory> launches;
  int64_t reached_step = 0;  // the last step logged
  int64_t saved_step = 0;    // the newest checkpoint's step (0: none)
  int64_t useful_steps = 0;  // steps a checkpoint holds: each counted once, however often computed
  double ideal_step_s = 0;   // median step time over every logged step
  double wall_s = 0;         // first launch's start to the last launch's end
  double idle_s = 0;         // summed time between launches
  double goodput = 0;        // useful_steps x ideal_step_s / wall_s
  size_t unreadable = 0;     // lines of events.jsonl that are not a launch or stop record
};

// RUN_DIR/events.jsonl's launch and stop records in order, and how many lines were neither (a line
// cut short by a kill?). A run without the file (older runs) has none.
struct EventLog {
  std::vector<nlohmann::json> records;
  size_t unreadable = 0;
};
EventLog read_events(const std::string& run_dir);

// metrics: the parsed lines of metrics.jsonl. A run without events has no launches and no goodput.
RunStory run_story(const std::string& run_dir, const EventLog& events, const std::vector<nlohmann::json>& metrics);

nlohmann::json to_json(const RunStory& story);
std::string describe(const RunStory& story);  // the report's lines for it

}  // namespace pipetrain
