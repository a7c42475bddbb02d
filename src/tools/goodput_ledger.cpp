#include "pipetrain/tools/goodput_ledger.hpp"

#include <algorithm>
#include <cstdio>
#include <map>

#include "pipetrain/tools/straggler_report.hpp"

using json = nlohmann::json;

namespace pipetrain {

double LedgerLaunch::parts_s() const {
  return startup_s + training_s + straggler_s + lost_s + checkpoint_s + eval_s + other_s;
}

namespace {

double number(const json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0;
}

// What one launch recorded: its launch and stop records, its kept metrics lines, and what the
// next launch's resume cut of it (the next launch record's "lost_before").
struct Records {
  const json* launch = nullptr;
  const json* stop = nullptr;
  const json* cut = nullptr;
  std::vector<const json*> lines;
};

LedgerLaunch account(const Records& r, double straggler_ratio) {
  LedgerLaunch l;
  const json& launch = *r.launch;
  l.launch = launch.value("launch", 0);
  const double recorded = number(launch, "unix");
  l.start = launch.contains("process_unix") ? number(launch, "process_unix") : recorded;
  l.startup_s = recorded - l.start;
  // Its totals and end: the stop record's, else the latest of its last kept line and the last line cut.
  json totals;
  double end = recorded;
  if (!r.lines.empty()) {
    totals = r.lines.back()->value("launch_totals", json());
    end = number(*r.lines.back(), "time");
  }
  if (r.cut && number(*r.cut, "last_time") >= end) {
    totals = r.cut->value("launch_totals", json());
    end = number(*r.cut, "last_time");
  }
  if (r.stop) {
    l.stopped = true;
    totals = r.stop->value("launch_totals", json());
    end = number(*r.stop, "unix");
  }
  l.end = std::max(end, recorded);
  const double steps_s = number(totals, "steps_s");
  l.checkpoint_s = number(totals, "checkpoint_s");
  l.eval_s = number(totals, "eval_s");
  if (r.cut) {
    l.lost_steps = r.cut->value("steps", int64_t{0});
    l.lost_s = std::min(steps_s, number(*r.cut, "steps_s"));
  }
  for (const json* line : r.lines)
    if (line->contains("window") && (*line)["window"].is_object())
      l.straggler_s += window_lost_s((*line)["window"], straggler_ratio);
  l.straggler_s = std::min(l.straggler_s, steps_s - l.lost_s);
  l.training_s = steps_s - l.lost_s - l.straggler_s;
  l.other_s = std::max(0.0, (l.end - recorded) - steps_s - l.checkpoint_s - l.eval_s);
  return l;
}

}  // namespace

Ledger goodput_ledger(const std::vector<json>& events, const std::vector<json>& metrics, double straggler_ratio) {
  std::map<int, Records> by_launch;
  for (const json& e : events) {
    if (!e.is_object() || !e.contains("launch") || !e["launch"].is_number_integer()) continue;
    const int k = e["launch"].get<int>();
    const std::string kind = e.value("event", "");
    if (kind == "launch") {
      by_launch[k].launch = &e;
      if (e.contains("lost_before") && e["lost_before"].is_object()) {
        const int cut_of = e["lost_before"].value("launch", 0);
        if (by_launch.count(cut_of)) by_launch[cut_of].cut = &e["lost_before"];
      }
    } else if (kind == "stop" && by_launch.count(k)) {
      by_launch[k].stop = &e;
    }
  }
  for (const json& m : metrics) {
    const auto it = by_launch.find(m.value("launch", 0));
    if (it != by_launch.end()) it->second.lines.push_back(&m);
  }
  Ledger ledger;
  for (const auto& [k, records] : by_launch)
    if (records.launch) ledger.launches.push_back(account(records, straggler_ratio));
  if (ledger.launches.empty()) return ledger;
  double covered = 0;
  for (size_t i = 0; i < ledger.launches.size(); ++i) {
    const LedgerLaunch& l = ledger.launches[i];
    covered += l.parts_s();
    if (i > 0) ledger.between_s += std::max(0.0, l.start - ledger.launches[i - 1].end);
  }
  ledger.wall_s = ledger.launches.back().end - ledger.launches.front().start;
  ledger.unaccounted_s = ledger.wall_s - covered - ledger.between_s;
  return ledger;
}

json to_json(const Ledger& ledger) {
  json launches = json::array();
  LedgerLaunch total;
  for (const LedgerLaunch& l : ledger.launches) {
    launches.push_back({{"launch", l.launch},
                        {"seconds", l.end - l.start},
                        {"stopped", l.stopped},
                        {"startup_s", l.startup_s},
                        {"training_s", l.training_s},
                        {"straggler_s", l.straggler_s},
                        {"lost_s", l.lost_s},
                        {"lost_steps", l.lost_steps},
                        {"checkpoint_s", l.checkpoint_s},
                        {"eval_s", l.eval_s},
                        {"other_s", l.other_s}});
    total.startup_s += l.startup_s;
    total.training_s += l.training_s;
    total.straggler_s += l.straggler_s;
    total.lost_s += l.lost_s;
    total.checkpoint_s += l.checkpoint_s;
    total.eval_s += l.eval_s;
    total.other_s += l.other_s;
  }
  return {{"launches", launches},
          {"total",
           {{"startup_s", total.startup_s},
            {"training_s", total.training_s},
            {"straggler_s", total.straggler_s},
            {"lost_s", total.lost_s},
            {"checkpoint_s", total.checkpoint_s},
            {"eval_s", total.eval_s},
            {"other_s", total.other_s},
            {"between_launches_s", ledger.between_s},
            {"unaccounted_s", ledger.unaccounted_s}}},
          {"wall_s", ledger.wall_s},
          {"training_share", ledger.wall_s > 0 ? total.training_s / ledger.wall_s : 0.0}};
}

std::string describe(const Ledger& ledger) {
  if (ledger.launches.empty()) return "";
  const double wall = ledger.wall_s > 0 ? ledger.wall_s : 1;
  auto part = [&](const char* name, double s) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s %.1f s (%.1f%%)", name, s, 100 * s / wall);
    return std::string(buf);
  };
  char head[160];
  std::snprintf(head, sizeof head,
                "  where the time went (%zu launch%s, %.1f s from the first start to the last end):\n",
                ledger.launches.size(), ledger.launches.size() > 1 ? "es" : "", ledger.wall_s);
  std::string out = head;
  LedgerLaunch t;
  for (const LedgerLaunch& l : ledger.launches) {
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "    %d  %.1f s: start-up %.1f, training %.1f, stragglers %.1f, lost %.1f (%lld steps), "
                  "checkpoints %.1f, evaluation %.1f, other %.1f%s\n",
                  l.launch, l.end - l.start, l.startup_s, l.training_s, l.straggler_s, l.lost_s,
                  static_cast<long long>(l.lost_steps), l.checkpoint_s, l.eval_s, l.other_s,
                  l.stopped ? "" : " (no stop record: ends at its last logged step)");
    out += buf;
    t.startup_s += l.startup_s, t.training_s += l.training_s, t.straggler_s += l.straggler_s;
    t.lost_s += l.lost_s, t.checkpoint_s += l.checkpoint_s, t.eval_s += l.eval_s, t.other_s += l.other_s;
  }
  out += "    total: " + part("training", t.training_s) + ", " + part("start-up", t.startup_s) + ", " +
         part("stragglers", t.straggler_s) + ", " + part("lost", t.lost_s) + ", " +
         part("checkpoints", t.checkpoint_s) + ", " + part("evaluation", t.eval_s) + ", " + part("other", t.other_s) +
         ", " + part("between launches", ledger.between_s) + ", " + part("unaccounted", ledger.unaccounted_s) + "\n";
  return out;
}

}  // namespace pipetrain
