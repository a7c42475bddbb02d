#include "pipetrain/tools/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "pipetrain/ckpt/checkpoint.hpp"
#include "pipetrain/config/spec.hpp"
#include "pipetrain/planner/plan.hpp"
#include "pipetrain/compute/profile.hpp"
#include "pipetrain/tools/run_story.hpp"
#include "pipetrain/tools/straggler_report.hpp"
#include "pipetrain/util/atomic_output.hpp"
#include "pipetrain/util/stats.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace pipetrain {
namespace {

// Median over logged steps of entry s of an array-valued key.
double stage_median(const std::vector<json>& lines, const char* key, size_t s) {
  std::vector<double> v;
  for (auto& l : lines)
    if (l.contains(key) && l[key].is_array() && s < l[key].size() && l[key][s].is_number()) v.push_back(l[key][s].get<double>());
  return median(v);
}

double scalar_median(const std::vector<json>& lines, const char* key) {
  std::vector<double> v;
  for (auto& l : lines)
    if (l.contains(key) && l[key].is_number()) v.push_back(l[key].get<double>());
  return median(v);
}

// printf of one value, "n/a" when the log did not have it (older or cut-short runs).
std::string fmt(const char* format, double v) {
  if (std::isnan(v)) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// "gemm 78.0% (201 GFLOP/s), attention 10.1%, ..., waiting 5.2%, other 0.4%": where stage s's own
// step time went over the logged steps (each part's seconds summed over the steps, over the steps'
// summed time, so the parts add up to 100%): each kernel class, the waits for peers (p2p,
// collectives, a late replica), and what neither covers; empty for logs without kernel_s.
std::string step_shares(const std::vector<json>& lines, size_t s) {
  auto at_stage = [&](const json& l, const char* key, const char* sub = nullptr) {
    const json* v = l.contains(key) ? &l[key] : nullptr;
    if (v && sub) v = v->is_object() && v->contains(sub) ? &(*v)[sub] : nullptr;
    return v && v->is_array() && s < v->size() && (*v)[s].is_number() ? (*v)[s].get<double>() : 0.0;
  };
  double step = 0;
  bool timed = false;
  for (const json& l : lines) step += at_stage(l, "rank_step_s"), timed = timed || l.contains("kernel_s");
  if (!timed || step <= 0) return "";
  std::string out;
  double covered = 0;
  for (int k = 0; k <= kKernelClasses; ++k) {  // the kernel classes, then the waits
    const bool waits = k == kKernelClasses;
    const char* name = waits ? "waiting" : kernel_name(static_cast<Kernel>(k));
    double seconds = 0;
    for (const json& l : lines) seconds += waits ? at_stage(l, "comm_wait_s") : at_stage(l, "kernel_s", name);
    covered += seconds / step;
    out += (k ? ", " : "") + std::string(name) + " " + fmt("%.1f%%", 100 * seconds / step);
    if (k == static_cast<int>(Kernel::gemm)) out += " (" + fmt("%.0f", stage_median(lines, "gemm_gflops", s)) + " GFLOP/s)";
  }
  return out + ", other " + fmt("%.1f%%", 100 * (1 - covered));
}

// trace.json, or when the last launch traced nothing, the newest earlier launch's traces/launch_K.json
// (relative to the run directory; "" when there is none).
std::string latest_trace(const std::string& run_dir) {
  std::error_code ec;
  if (fs::exists(run_dir + "/trace.json", ec)) return "trace.json";
  int newest = 0;
  for (auto& e : fs::directory_iterator(run_dir + "/traces", ec)) {
    int k = 0;
    if (std::sscanf(e.path().filename().c_str(), "launch_%d.json", &k) == 1) newest = std::max(newest, k);
  }
  return newest ? "traces/launch_" + std::to_string(newest) + ".json" : "";
}

std::string mib(double b) { return fmt("%.2f MiB", b / (1 << 20)); }

// scripts/analysis/plots.py next to the sources this binary was built from, or PIPETRAIN_SCRIPTS.
std::string plots_script() {
  if (const char* d = std::getenv("PIPETRAIN_SCRIPTS")) return std::string(d) + "/plots.py";
  return std::string(PIPETRAIN_SOURCE_DIR) + "/scripts/analysis/plots.py";
}

// What --plots may replace: a folder of plots.py's PNG files and nothing else.
bool is_plots_folder(const std::string& dir) {
  return folder_holds_only(dir, [](const std::string& name) { return fs::path(name).extension() == ".png"; });
}

}  // namespace

ExitCode run_report(const std::string& run_dir, const std::string& plots_dir, bool as_json) {
  // The text report goes to stdout; with --json a document of the same figures does instead.
  json doc = {{"run_dir", run_dir}};
  auto say = [&](const char* format, auto... args) {
    if (!as_json) std::printf(format, args...);
  };
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) {
    report_error(run_dir + ": no such run directory");
    return ExitCode::bad_input;
  }
  // The plots are drawn into a staging folder and renamed into place whole.
  std::optional<AtomicOutput> plots;
  if (!plots_dir.empty())
    plots.emplace(plots_dir, OutputRule{"report", "--plots", "a folder of report plots (PNG files only)",
                                        is_plots_folder, {run_dir}, true});
  std::vector<std::string> missing;
  say("run %s\n", run_dir.c_str());

  // The spec, and from it the prediction.
  RunSpec spec;
  bool have_spec = false;
  try {
    spec = load_spec(run_dir + "/config.toml", {}, 0);
    have_spec = true;
    say("  spec: pp %d x dp %d, M=%d, recompute %s, %d steps, %d-block GPT d_model %d\n", spec.parallel.pp,
                spec.parallel.dp, spec.parallel.micro_batches, name_of(spec.parallel.recompute), spec.run.steps,
                spec.model.n_layer, spec.model.d_model);
  } catch (const SpecError& e) {
    missing.push_back(std::string("config.toml (") + e.what() + "): no prediction to compare with");
  }

  // What was measured.
  std::vector<json> lines;
  size_t bad_lines = 0;
  std::ifstream in(run_dir + "/metrics.jsonl");
  if (!in) missing.push_back("metrics.jsonl: nothing was logged (the run died before its first step?)");
  size_t inconsistent = 0;
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) {
      bad_lines += !line.empty();
      continue;
    }
    // Each per-stage array holds one entry per stage of the line's own pp: one that does not was
    // damaged or written by something else, and would be taken for another layout's step.
    const int pp = j.value("pp", -1);
    bool fits = pp >= 1;
    for (const char* key : {"bubble_measured", "act_peak_bytes", "mem_peak_bytes"})
      fits = fits && j.contains(key) && j[key].is_array() && j[key].size() == static_cast<size_t>(pp);
    if (fits || !j.contains("pp")) lines.push_back(std::move(j));  // lines of old runs carry no pp
    else ++inconsistent;
  }
  if (bad_lines) missing.push_back(std::to_string(bad_lines) + " unreadable line(s) in metrics.jsonl (cut short by a kill?)");
  if (inconsistent)
    missing.push_back(std::to_string(inconsistent) + " line(s) of metrics.jsonl left out: their per-stage arrays do not "
                      "have one entry per stage of their own pp (damaged?)");
  if (!have_spec && lines.empty()) {
    report_error(run_dir + " holds neither config.toml nor metrics.jsonl");
    return ExitCode::bad_input;
  }
  if (!lines.empty()) {
    const json &first = lines.front(), &last = lines.back();
    const int last_step = last["step"].get<int>();
    doc["progress"] = {{"step", last_step}, {"of", have_spec ? json(spec.run.steps) : json(nullptr)},
                       {"complete", have_spec && last_step >= spec.run.steps}};
    doc["loss"] = {{"first", first.value("loss", json(nullptr))}, {"last", last.value("loss", json(nullptr))}};
    doc["step_time_median_s"] = scalar_median(lines, "step_time_s");
    doc["mfu_median"] = scalar_median(lines, "mfu");
    doc["sgemm_share_median"] = scalar_median(lines, "sgemm_share");
    if (have_spec)
      say("  progress: %d of %d steps%s\n", last_step, spec.run.steps,
                  last_step >= spec.run.steps ? " (complete)" : " (incomplete: stopped or killed; resume continues it)");
    say("  loss: %.4f at step %d -> %.4f at step %d\n", first.value("loss", NAN), first["step"].get<int>(),
                last.value("loss", NAN), last_step);
    const json* latest_val = nullptr;  // the last evaluation and the best one
    const json* best_val = nullptr;
    for (const json& l : lines)
      if (l.contains("val_loss")) {
        latest_val = &l;
        if (!best_val || l["val_loss"].get<double>() < (*best_val)["val_loss"].get<double>()) best_val = &l;
      }
    if (latest_val) doc["val_loss"] = {{"latest", (*latest_val)["val_loss"]}, {"best", (*best_val)["val_loss"]}};
    if (latest_val)
      say("  val_loss: %.4f at step %d (best %.4f at step %d)\n", (*latest_val)["val_loss"].get<double>(),
                  (*latest_val)["step"].get<int>(), (*best_val)["val_loss"].get<double>(), (*best_val)["step"].get<int>());
    say("  step time: median %s, %s tokens/s, %s GFLOP/s, MFU %s (%s of sgemm)\n",
                fmt("%.1f ms", 1e3 * scalar_median(lines, "step_time_s")).c_str(),
                fmt("%.0f", scalar_median(lines, "tokens_per_s")).c_str(), fmt("%.1f", scalar_median(lines, "gflops")).c_str(),
                fmt("%.1f%%", 100 * scalar_median(lines, "mfu")).c_str(),
                fmt("%.0f%%", 100 * scalar_median(lines, "sgemm_share")).c_str());
  }
  const RunStory story = run_story(run_dir, lines);  // the launches: for the bubble note and the history
  if (story.unreadable)
    missing.push_back(std::to_string(story.unreadable) + " unreadable line(s) in events.jsonl (cut short by a kill?)");
  // The per-stage figures come from the steps of the last logged layout (a run resumed on another
  // layout logged its earlier steps with other stages and batch shapes); the prediction is for the
  // spec's layout, shown only when the two are the same (a last launch may have logged no step).
  auto stages_of = [](const json& l) { return l.value("bubble_measured", json::array()).size(); };
  const size_t P = !lines.empty() ? stages_of(lines.back()) : have_spec ? spec.parallel.pp : 0;
  const int logged_dp = lines.empty() ? -1 : lines.back().value("dp", -1);
  std::vector<json> per_stage;
  for (auto& l : lines)
    if (l.contains("bubble_measured") && l["bubble_measured"].is_array() && stages_of(l) == P && l.value("dp", -1) == logged_dp)
      per_stage.push_back(l);
  const bool predicted = have_spec && static_cast<size_t>(spec.parallel.pp) == P && (logged_dp < 0 || spec.parallel.dp == logged_dp);
  Plan plan;
  if (predicted) plan = make_plan(spec);
  const int mode = have_spec ? static_cast<int>(spec.parallel.recompute) : 0;
  if (P > 0) {
    if (have_spec && !predicted)
      say("  per stage: of the logged steps' layout, pp %zu x dp %d (config.toml's pp %d x dp %d logged no step: no "
          "prediction)\n", P, logged_dp, spec.parallel.pp, spec.parallel.dp);
    if (predicted)
      say("  bubble of the %s schedule with even stages = %.3f; per stage: measured median vs simulated\n",
                  spec.parallel.schedule->name.c_str(), plan.bubble_theory);
    const int logged_launch = lines.empty() ? -1 : lines.back().value("launch", -1);
    auto measured_by = std::find_if(story.launches.begin(), story.launches.end(),
                                    [&](const LaunchStory& l) { return l.launch == logged_launch; });
    if (measured_by != story.launches.end() && measured_by->oversubscribed()) {
      const LaunchStory& l = *measured_by;
      say("    (the launch measured ran %d ranks x %d threads on a node of %d cores: time a rank waited for a core is "
          "measured as bubble, which the simulation does not count)\n",
          l.ranks_per_node, l.threads_per_rank, l.node_cores);
    }
    if (per_stage.size() < lines.size())
      say("    (%zu logged steps of an earlier layout left out of the per-stage figures)\n",
                  lines.size() - per_stage.size());
    for (size_t s = 0; s < P; ++s) {
      say("    stage %zu: bubble %s", s, fmt("%.3f", stage_median(per_stage, "bubble_measured", s)).c_str());
      if (predicted) say(" (sim %.3f)", plan.stages[s].bubble);
      say(" | activations %s", mib(stage_median(per_stage, "act_peak_bytes", s)).c_str());
      if (predicted) say(" (plan %s)", mib(plan.stages[s].act_peak_bytes[mode]).c_str());
      say(" | RSS %s | params+grads+AdamW %s\n", mib(stage_median(per_stage, "mem_peak_bytes", s)).c_str(),
                  mib(stage_median(per_stage, "param_bytes", s) * 4).c_str());
      const std::string shares = step_shares(per_stage, s);
      if (!shares.empty()) say("      step by kernel: %s\n", shares.c_str());
    }
  }

  // Who held the others up.
  const StragglerReport stragglers = straggler_report(per_stage, have_spec ? spec.log.straggler_ratio : RunSpec{}.log.straggler_ratio);
  say("%s", stragglers.text.c_str());
  if (!stragglers.json.is_null()) doc["stragglers"] = stragglers.json;

  // The run's history across launches.
  doc["history"] = to_json(story);
  say("%s", describe(story).c_str());

  // What survived.
  const std::string ck = run_dir + "/checkpoints";
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(ck, ec))
    if (e.path().filename().string().rfind("step_", 0) == 0) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  if (names.empty()) missing.push_back("checkpoints: none saved; a restart begins at step 0");
  else {
    std::string latest;
    std::ifstream(ck + "/latest") >> latest;
    say("  checkpoints:");
    for (auto& n : names) say(" %s", n.c_str());
    const std::string problem = latest.empty() ? "no latest file" : verify_checkpoint(ck + "/" + latest);
    doc["checkpoints"] = {{"saved", names}, {"latest", latest}, {"intact", problem.empty()}};
    say("\n    latest %s: %s\n", latest.empty() ? "?" : latest.c_str(), problem.empty() ? "intact" : problem.c_str());
  }
  const std::string trace = latest_trace(run_dir);
  if (!trace.empty()) say("  trace: %s (open in Perfetto / chrome://tracing)\n", trace.c_str());
  else missing.push_back("trace.json: not written (log.trace_steps = 0, or the run died before its traced steps ended)");
  for (auto& m : missing) say("  missing: %s\n", m.c_str());
  doc["missing"] = missing;
  if (as_json) std::printf("%s\n", doc.dump(2).c_str());

  if (!plots) return ExitCode::ok;
  std::string cmd = "/usr/bin/python3 '" + plots_script() + "' '" + run_dir + "' '" + plots->staging() + "' --shown-as '" +
                    plots_dir + "'";
  if (predicted) {  // bubble.png draws the simulation's bubble of each stage too
    cmd += " --sim-bubble ";
    for (size_t s = 0; s < plan.stages.size(); ++s) cmd += (s ? "," : "") + fmt("%.6f", plan.stages[s].bubble);
  }
  std::fflush(stdout);  // the report before the plotter's lines
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    report_error("plotting failed (" + cmd + "); it needs /usr/bin/python3 with matplotlib (Debian: python3-matplotlib)");
    return ExitCode::fault;
  }
  plots->commit();
  return ExitCode::ok;
}

}  // namespace pipetrain
