#include "pipetrain/tools/run_story.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "pipetrain/ckpt/resume.hpp"
#include "pipetrain/util/clock.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace pipetrain {

EventLog read_events(const std::string& run_dir) {
  EventLog log;
  std::ifstream in(run_dir + "/events.jsonl");
  for (std::string line; std::getline(in, line);) {
    json e = json::parse(line, nullptr, false);
    if (e.is_object() && e.contains("launch") && e["launch"].is_number_integer()) log.records.push_back(std::move(e));
    else log.unreadable += !line.empty();
  }
  return log;
}

RunStory run_story(const std::string& run_dir, const EventLog& events, const std::vector<json>& metrics) {
  RunStory story;
  story.unreadable = events.unreadable;
  for (const json& e : events.records) {
    const std::string kind = e.value("event", "");
    if (kind == "launch") {
      LaunchStory l;
      l.launch = e["launch"].get<int>();
      l.start = l.end = e.value("unix", 0.0);
      l.job_id = e.contains("job_id") && e["job_id"].is_string() ? e["job_id"].get<std::string>() : "";
      if (e.contains("layout") && e["layout"].is_object())
        l.layout = grid_text(e["layout"].value("tp", 1), e["layout"].value("pp", 0), e["layout"].value("dp", 0));
      l.resumed_from =
          e.contains("resumed_from") && e["resumed_from"].is_number() ? e["resumed_from"].get<int64_t>() : -1;
      // The log is cut back to the resume step: how far the launch before got is in this record.
      if (!story.launches.empty())
        story.launches.back().last_step =
            std::max(story.launches.back().last_step, e.value("last_logged_before", int64_t{0}));
      l.ended = "no stop record";
      l.ranks_per_node = e.value("ranks_per_node", 0);
      l.threads_per_rank = e.value("threads_per_rank", 0);
      l.node_cores = e.value("node_cores", 0);
      l.ranks = e.value("ranks", 0);
      if (e.contains("layout_choice") && e["layout_choice"].is_object())
        l.chosen_because = e["layout_choice"].value("summary", "") + "; " + e["layout_choice"].value("reason", "");
      story.launches.push_back(l);
    } else if (kind == "stop" && !story.launches.empty() && story.launches.back().launch == e["launch"].get<int>()) {
      LaunchStory& l = story.launches.back();
      l.ended = e.value("reason", "?");
      l.exit_code = e.value("exit_code", -1);
      if (e.contains("exclude_nodes") && e["exclude_nodes"].is_array())
        for (const json& node : e["exclude_nodes"])
          l.acted += (l.acted.empty() ? "without " : ", ") + (node.is_string() ? node.get<std::string>() : "?");
      if (e.contains("partition") && e["partition"].is_object())
        l.acted = "partition " + e["partition"].value("from", json::array()).dump() + " -> " +
                  e["partition"].value("to", json::array()).dump();
      l.end = std::max(l.end, e.value("unix", 0.0));
    }
  }
  std::vector<double> step_times;
  for (const json& m : metrics) {
    if (m.contains("step_time_s") && m["step_time_s"].is_number()) step_times.push_back(m["step_time_s"].get<double>());
    const int launch = m.value("launch", 0);
    for (LaunchStory& l : story.launches) {
      if (l.launch != launch) continue;
      const int64_t step = m.value("step", 0);
      l.first_step = l.first_step ? std::min(l.first_step, step) : step;  // (last_step may come from above)
      l.last_step = std::max(l.last_step, step);
      l.end = std::max(l.end, m.value("time", 0.0));  // a launch without a stop record ended after its last step
    }
    story.reached_step = std::max<int64_t>(story.reached_step, m.value("step", 0));
  }
  // Useful work is what a checkpoint holds: the steps after the newest one (a NaN stop, a kill
  // before the next save) were computed for nothing.
  const std::vector<std::string> saved = checkpoints_named_by(run_dir + "/checkpoints");  // newest first
  if (!saved.empty())
    story.saved_step = std::strtoll(fs::path(saved.front()).filename().c_str() + 5, nullptr, 10);  // step_N
  story.useful_steps = std::min(story.reached_step, story.saved_step);
  if (story.launches.empty()) return story;
  for (size_t i = 1; i < story.launches.size(); ++i) {
    LaunchStory &before = story.launches[i - 1], &l = story.launches[i];
    l.idle_before = std::max(0.0, l.start - before.end);
    story.idle_s += l.idle_before;
    if (l.resumed_from >= 0) l.recomputed = std::max<int64_t>(0, before.last_step - l.resumed_from);
  }
  if (!step_times.empty()) {
    std::nth_element(step_times.begin(), step_times.begin() + step_times.size() / 2, step_times.end());
    story.ideal_step_s = step_times[step_times.size() / 2];
  }
  story.wall_s = story.launches.back().end - story.launches.front().start;
  story.goodput = story.wall_s > 0 ? story.useful_steps * story.ideal_step_s / story.wall_s : 0;
  return story;
}

json to_json(const RunStory& s) {
  json launches = json::array();
  for (const LaunchStory& l : s.launches)
    launches.push_back({{"launch", l.launch},
                        {"start", iso_utc(l.start)},
                        {"end", iso_utc(l.end)},
                        {"seconds", l.end - l.start},
                        {"job_id", l.job_id.empty() ? json(nullptr) : json(l.job_id)},
                        {"layout", l.layout},
                        {"ranks", l.ranks > 0 ? json(l.ranks) : json(nullptr)},
                        {"layout_chosen_by_auto", l.chosen_because.empty() ? json(nullptr) : json(l.chosen_because)},
                        {"resumed_from", l.resumed_from >= 0 ? json(l.resumed_from) : json(nullptr)},
                        {"steps", {l.first_step, l.last_step}},
                        {"ended", l.ended},
                        {"acted", l.acted.empty() ? json(nullptr) : json(l.acted)},
                        {"exit_code", l.exit_code >= 0 ? json(l.exit_code) : json(nullptr)},
                        {"steps_recomputed", l.recomputed},
                        {"idle_before_s", l.idle_before},
                        {"oversubscribed", l.oversubscribed()}});
  return {{"launches", launches},
          {"useful_steps", s.useful_steps},
          {"reached_step", s.reached_step},
          {"saved_step", s.saved_step},
          {"ideal_step_s", s.ideal_step_s},
          {"wall_s", s.wall_s},
          {"idle_s", s.idle_s},
          {"goodput", s.goodput}};
}

std::string describe(const RunStory& s) {
  if (s.launches.empty())
    return "  launches: not recorded (no events.jsonl: a run from before pipetrain kept its history)\n";
  std::string out = "  launches:\n";
  char buf[512];
  for (const LaunchStory& l : s.launches) {
    std::snprintf(buf, sizeof buf, "    %d  %s  %6.1f s  %-12s  %s  %s  ended: %s%s%s", l.launch,
                  iso_utc(l.start).c_str(), l.end - l.start, l.layout.c_str(),
                  l.resumed_from >= 0 ? ("resumed at " + std::to_string(l.resumed_from)).c_str() : "fresh start",
                  l.first_step ? ("steps " + std::to_string(l.first_step) + "-" + std::to_string(l.last_step)).c_str()
                               : "no step logged",
                  l.ended.c_str(), l.acted.empty() ? "" : (" (" + l.acted + ")").c_str(),
                  l.exit_code >= 0 ? (" (exit " + std::to_string(l.exit_code) + ")").c_str() : "");
    out += buf;
    if (!l.job_id.empty()) out += "  job " + l.job_id;
    if (l.launch > 1) {
      std::snprintf(buf, sizeof buf, "  | idle %.1f s before, %lld step(s) recomputed", l.idle_before,
                    static_cast<long long>(l.recomputed));
      out += buf;
    }
    out += "\n";
    if (!l.chosen_because.empty()) out += "       layout chosen by parallel.auto: " + l.chosen_because + "\n";
  }
  std::snprintf(
      buf, sizeof buf,
      "  goodput: %.1f%% = %lld useful steps x %.1f ms ideal step / %.1f s wall (%.1f s idle between launches)\n",
      100 * s.goodput, static_cast<long long>(s.useful_steps), 1e3 * s.ideal_step_s, s.wall_s, s.idle_s);
  out += buf;
  if (s.reached_step > s.useful_steps)
    out += "    (useful: the steps a checkpoint holds; " + std::to_string(s.reached_step - s.useful_steps) +
           " step(s) after " +
           (s.saved_step > 0 ? "the newest checkpoint, step " + std::to_string(s.saved_step) + ","
                             : "the start, with no checkpoint,") +
           " were lost)\n";
  return out;
}

}  // namespace pipetrain
