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
  if (launch.contains("job_id") && launch["job_id"].is_string()) l.job_id = launch["job_id"].get<std::string>();
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

// Each Slurm start's queue and job-script time, put on the launches it holds; the time line of
// starts and of launches outside any, whose gaps are outside everything (between_s).
void place_starts(Ledger& ledger, const std::vector<SlurmAttempt>& attempts) {
  struct Span {
    double begin, end;
  };
  std::vector<Span> spans;
  // The start that ran each launch: the one it began in (sacct's whole seconds allow a second), or
  // where sacct lost that start (a start ended by a node failure can be missing, its queue then
  // running on to the next start), the one in whose queue it began.
  const size_t n = ledger.launches.size();
  std::vector<int> start_of(n, -1);
  for (int pass = 0; pass < 2; ++pass)
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < attempts.size() && start_of[i] < 0; ++j) {
        const SlurmAttempt& a = attempts[j];
        const double t = ledger.launches[i].start;
        const bool inside = pass == 0 ? t >= a.start - 1 && t <= a.end + 1 : t >= a.submit && t < a.start;
        if (ledger.launches[i].job_id == a.job_id && inside) start_of[i] = static_cast<int>(j);
      }
  for (size_t j = 0; j < attempts.size(); ++j) {
    const SlurmAttempt& a = attempts[j];
    std::vector<size_t> in;
    for (size_t i = 0; i < n; ++i)
      if (start_of[i] == static_cast<int>(j)) in.push_back(i);
    spans.push_back({a.submit, a.end});
    if (in.empty()) {
      ++ledger.unlaunched;
      ledger.unlaunched_s += a.end - a.submit;  // its queue too
      continue;
    }
    LedgerLaunch &first = ledger.launches[in.front()], &last = ledger.launches[in.back()];
    if (first.start >= a.start - 1) {
      first.queue_s = a.start - a.submit;
      first.script_s += std::max(0.0, first.start - a.start);
    } else {  // sacct lost the start that ran it: its queue and script are not told apart
      ++ledger.starts_lost;
      ledger.between_s += first.start - a.submit;
    }
    last.script_s += std::max(0.0, a.end - last.end);
    for (size_t k = 1; k < in.size(); ++k)  // in-process restarts
      ledger.between_s += std::max(0.0, ledger.launches[in[k]].start - ledger.launches[in[k - 1]].end);
  }
  for (size_t i = 0; i < n; ++i)
    if (start_of[i] < 0) spans.push_back({ledger.launches[i].start, ledger.launches[i].end});
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  double reached = spans.front().end;
  for (const Span& s : spans) {
    ledger.between_s += std::max(0.0, s.begin - reached);
    reached = std::max(reached, s.end);
  }
  ledger.wall_s = reached - spans.front().begin;
}

}  // namespace

Ledger goodput_ledger(const std::vector<json>& events, const std::vector<json>& metrics, double straggler_ratio,
                      const std::vector<SlurmAttempt>& attempts, const std::string& slurm) {
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
  ledger.slurm = attempts.empty() ? slurm : "sacct";
  ledger.slurm_starts = static_cast<int>(attempts.size());
  for (const auto& [k, records] : by_launch)
    if (records.launch) ledger.launches.push_back(account(records, straggler_ratio));
  if (ledger.launches.empty()) return ledger;
  place_starts(ledger, attempts);
  double covered = ledger.between_s + ledger.unlaunched_s;
  for (const LedgerLaunch& l : ledger.launches) covered += l.parts_s() + l.queue_s + l.script_s;
  ledger.unaccounted_s = ledger.wall_s - covered;
  return ledger;
}

namespace {
// The parts of a launch, or of several summed, by name (the JSON keys; report's words below).
std::vector<std::pair<const char*, double>> parts_of(const LedgerLaunch& l) {
  return {{"queue_s", l.queue_s},           {"script_s", l.script_s},       {"startup_s", l.startup_s},
          {"training_s", l.training_s},     {"straggler_s", l.straggler_s}, {"lost_s", l.lost_s},
          {"checkpoint_s", l.checkpoint_s}, {"eval_s", l.eval_s},           {"other_s", l.other_s}};
}

LedgerLaunch summed(const Ledger& ledger) {
  LedgerLaunch t;
  for (const LedgerLaunch& l : ledger.launches) {
    t.queue_s += l.queue_s, t.script_s += l.script_s, t.startup_s += l.startup_s;
    t.training_s += l.training_s, t.straggler_s += l.straggler_s, t.lost_s += l.lost_s;
    t.checkpoint_s += l.checkpoint_s, t.eval_s += l.eval_s, t.other_s += l.other_s;
    t.lost_steps += l.lost_steps;
  }
  return t;
}
}  // namespace

json to_json(const Ledger& ledger) {
  json launches = json::array();
  for (const LedgerLaunch& l : ledger.launches) {
    json one = {{"launch", l.launch},
                {"job_id", l.job_id.empty() ? json(nullptr) : json(l.job_id)},
                {"seconds", l.end - l.start},
                {"stopped", l.stopped},
                {"lost_steps", l.lost_steps}};
    for (const auto& [key, s] : parts_of(l)) one[key] = s;
    launches.push_back(one);
  }
  json total = json::object();
  for (const auto& [key, s] : parts_of(summed(ledger))) total[key] = s;
  total["no_launch_s"] = ledger.unlaunched_s;
  total["between_s"] = ledger.between_s;
  total["unaccounted_s"] = ledger.unaccounted_s;
  return {{"launches", launches},
          {"total", total},
          {"wall_s", ledger.wall_s},
          {"slurm", ledger.slurm},
          {"slurm_starts", ledger.slurm_starts},
          {"starts_without_launch", ledger.unlaunched},
          {"starts_sacct_lost", ledger.starts_lost},
          {"training_share", ledger.wall_s > 0 ? summed(ledger).training_s / ledger.wall_s : 0.0}};
}

std::string describe(const Ledger& ledger) {
  if (ledger.launches.empty()) return "";
  const bool slurm = ledger.slurm == "sacct";
  char buf[400];
  std::snprintf(
      buf, sizeof buf, "  where the time went (%zu launch%s, %.1f s from the first %s to the last end; Slurm: %s):\n",
      ledger.launches.size(), ledger.launches.size() > 1 ? "es" : "", ledger.wall_s, slurm ? "submission" : "start",
      slurm ? ("sacct, " + std::to_string(ledger.slurm_starts) + " starts").c_str() : ledger.slurm.c_str());
  std::string out = buf;
  for (const LedgerLaunch& l : ledger.launches) {
    std::string queue;
    if (slurm && !l.job_id.empty()) {
      std::snprintf(buf, sizeof buf, "queue %.1f, job script %.1f, ", l.queue_s, l.script_s);
      queue = buf;
    }
    std::snprintf(buf, sizeof buf,
                  "    %d  %.1f s: %sstart-up %.1f, training %.1f, stragglers %.1f, lost %.1f (%lld steps), "
                  "checkpoints %.1f, evaluation %.1f, other %.1f%s\n",
                  l.launch, l.end - l.start, queue.c_str(), l.startup_s, l.training_s, l.straggler_s, l.lost_s,
                  static_cast<long long>(l.lost_steps), l.checkpoint_s, l.eval_s, l.other_s,
                  l.stopped ? "" : " (no stop record: ends at its last logged step)");
    out += buf;
  }
  const double wall = ledger.wall_s > 0 ? ledger.wall_s : 1;
  const LedgerLaunch t = summed(ledger);
  auto part = [&](const char* name, double s) {
    std::snprintf(buf, sizeof buf, "%s %.1f s (%.1f%%)", name, s, 100 * s / wall);
    return std::string(buf);
  };
  out += "    total: " + part("training", t.training_s) + ", " + part("start-up", t.startup_s) + ", " +
         part("stragglers", t.straggler_s) + ", " + part("lost", t.lost_s) + ", " +
         part("checkpoints", t.checkpoint_s) + ", " + part("evaluation", t.eval_s) + ", " + part("other", t.other_s) +
         ", ";
  if (slurm)
    out += part("queue", t.queue_s) + ", " + part("job script", t.script_s) + ", " +
           part(("starts without a launch (" + std::to_string(ledger.unlaunched) + ")").c_str(), ledger.unlaunched_s) +
           ", ";
  out += part("between", ledger.between_s) + ", " + part("unaccounted", ledger.unaccounted_s) + "\n";
  if (ledger.starts_lost > 0)
    out += "    sacct lost " + std::to_string(ledger.starts_lost) +
           " start(s) that ran a launch: their queue and job script time is counted as between\n";
  return out;
}

}  // namespace pipetrain
