#include "pipetrain/train/run_history.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "pipetrain/dist/signals.hpp"
#include "pipetrain/util/clock.hpp"
#include "pipetrain/util/errors.hpp"
#include "pipetrain/util/version.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace pipetrain {
namespace {

std::string events_path(const RunState& state) { return state.run_dir + "/events.jsonl"; }

// The launches recorded so far (lines that do not parse, e.g. one cut by a crash, are skipped).
std::vector<json> launch_records(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::vector<json> launches;
  while (std::getline(in, line)) {
    json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.value("event", "") == "launch") launches.push_back(std::move(j));
  }
  return launches;
}

std::string per_unit(const char* figure, bool gpu) { return std::string(figure) + (gpu ? "_per_gpu" : "_per_core"); }

// One record: appended whole (a single write on an O_APPEND descriptor) and fsynced. The history
// is a log, not the run's state: a record that cannot be written is a warning, never a stop.
void append(const std::string& path, json record) {
  const double now = wall_clock_s();
  record["time"] = iso_utc(now);
  record["unix"] = std::round(now * 1000) / 1000;
  const std::string line = record.dump() + "\n";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  const bool ok =
      fd >= 0 && ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) && ::fsync(fd) == 0;
  if (fd >= 0) ::close(fd);
  if (!ok) std::fprintf(stderr, "pipetrain: warning: cannot append to %s; the run goes on without it\n", path.c_str());
}

std::string signal_name(int sig) {
  switch (sig) {
    case SIGUSR1:
      return "SIGUSR1";
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    default:
      return "signal " + std::to_string(sig);
  }
}

// What the launch before lost: the steps it logged past this launch's resume step, which are
// computed again, and their time by its running totals ("launch_totals": those before it in its
// launch subtracted); with the last line's time and totals, where that launch got to (a launch
// with no stop record ended after it). Null when nothing was cut.
json lost_before(const CutLog& cut, int64_t resumed_step) {
  if (cut.last_step <= resumed_step || !cut.last_line.is_object()) return nullptr;
  const json& last = cut.last_line;
  const json& kept = cut.kept_last_line;
  const int launch = last.value("launch", 0);
  auto steps_s = [](const json& line) {
    return line.contains("launch_totals") ? line["launch_totals"].value("steps_s", 0.0) : 0.0;
  };
  const bool same_launch = kept.is_object() && kept.value("launch", -1) == launch;
  return {{"launch", launch},
          {"steps", cut.last_step - resumed_step},
          {"steps_s",
           last.contains("launch_totals") ? json(steps_s(last) - (same_launch ? steps_s(kept) : 0.0)) : json(nullptr)},
          {"last_time", last.value("time", 0.0)},
          {"launch_totals", last.value("launch_totals", json(nullptr))}};
}
}  // namespace

int record_launch(const Run& run) {
  const std::string path = events_path(run.state);
  const int launch = static_cast<int>(launch_records(path).size()) + 1;
  // Each launch writes trace.json afresh: the one before keeps its trace under its own index.
  std::error_code ec;
  const std::string trace = run.state.run_dir + "/trace.json";
  if (launch > 1 && fs::exists(trace, ec)) {
    fs::create_directories(run.state.run_dir + "/traces", ec);
    fs::rename(trace, run.state.run_dir + "/traces/launch_" + std::to_string(launch - 1) + ".json", ec);
  }
  const RunSpec& spec = run.spec;
  json record = {{"event", "launch"},
                 {"launch", launch},
                 {"job_id", run.layout.launch.job_id.empty() ? json(nullptr) : json(run.layout.launch.job_id)},
                 {"restart_count", run.layout.launch.restart_count},
                 {"hosts", run.world.nodes()},
                 {"ranks", run.world.size()},
                 {"ranks_per_node", run.world.local_ranks()},
                 {"threads_per_rank", run.layout.blas_threads},
                 {"node_cores", run.world.cores()},
                 {"layout",
                  {{"tp", spec.parallel.tp},
                   {"pp", spec.parallel.pp},
                   {"dp", spec.parallel.dp},
                   {"schedule", spec.parallel.schedule->name},
                   {"virtual_stages", spec.parallel.virtual_stages}}},
                 {"version", version_string()},
                 {"build", build_id()},
                 {"resumed_from", run.state.resumed_from.empty() ? json(nullptr) : json(run.state.start_step)},
                 {"last_logged_before", run.state.cut_log.last_step},
                 {"process_unix", run.started_unix},
                 {per_unit("hardware_peak_gflops", run.on_gpu()), run.telemetry.peak_per_unit},
                 {per_unit("sgemm_gflops", run.on_gpu()), run.telemetry.sgemm_per_unit},
                 {"peak_basis", run.telemetry.peak_basis},
                 {"peak_dtype", name_of(spec.model.dtype)}};
  if (!run.opt.restart_note.empty()) record["restart"] = run.opt.restart_note;
  if (json lost = lost_before(run.state.cut_log, run.state.start_step); !lost.is_null()) record["lost_before"] = lost;
  if (const auto& pick = run.state.auto_layout)
    record["layout_choice"] = {{"by", "parallel.auto"},
                               {"summary", pick->summary},
                               {"reason", pick->reason},
                               {"costs", pick->measured ? "measured" : "kept"}};
  append(path, record);
  return launch;
}

RecordedPeaks recorded_peaks(const std::string& run_dir, bool gpu, Dtype dtype) {
  const std::string peak = per_unit("hardware_peak_gflops", gpu), sgemm = per_unit("sgemm_gflops", gpu);
  for (const json& launch : launch_records(run_dir + "/events.jsonl"))
    if (launch.value("peak_dtype", "fp32") == name_of(dtype) && launch.contains(peak) && launch[peak].is_number() &&
        launch.contains(sgemm) && launch[sgemm].is_number())
      return {launch[peak].get<double>(), launch[sgemm].get<double>(), launch.value("peak_basis", "")};
  return {};
}

void record_stop(const RunState& state, const std::string& reason, ExitCode code, int64_t step, const json& extra) {
  json record = {{"event", "stop"},
                 {"launch", state.launch_index},
                 {"reason", reason},
                 {"exit_code", static_cast<int>(code)},
                 {"step", step},
                 {"signal", reason == "signal" ? json(signal_name(stop_signal())) : json(nullptr)},
                 {"last_checkpoint", state.last_saved >= 0 ? json(state.last_saved) : json(nullptr)}};
  record.update(extra);
  append(events_path(state), record);
}

}  // namespace pipetrain
