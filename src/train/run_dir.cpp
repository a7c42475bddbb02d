#include "pipetrain/train/run_dir.hpp"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "pipetrain/observe/metrics.hpp"
#include "pipetrain/util/files.hpp"

namespace fs = std::filesystem;

namespace pipetrain {
namespace {

// Moves `path` aside to path.N (first free N) and returns a note saying so.
std::string move_aside(const std::string& path) {
  std::error_code ec;
  int n = 1;
  while (fs::exists(path + "." + std::to_string(n), ec)) ++n;
  const std::string to = path + "." + std::to_string(n);
  fs::rename(path, to, ec);
  if (ec) throw SpecError(path + ": cannot move the previous one aside (" + ec.message() + ")");
  return "previous " + fs::path(path).filename().string() + " kept as " + fs::path(to).filename().string();
}

}  // namespace

std::string resolve_run_dir(const std::string& run_dir_option, const RunSpec& spec) {
  return run_dir_option.empty() ? spec.run.out_dir + "/" + spec.run.name : run_dir_option;
}

void check_run_dir_is_a_run(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;  // made by the run (a file in the way is said by the lock)
  std::vector<std::string> others;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    for (const char* ours : {".lock", "config.toml", "metrics.jsonl", "events.jsonl", "checkpoints"})
      if (name == ours) return;
    others.push_back(name);
  }
  if (others.empty()) return;
  std::sort(others.begin(), others.end());
  throw SpecError("run dir " + dir + " is not empty and is not a pipetrain run (it holds " +
                  std::to_string(others.size()) + (others.size() == 1 ? " entry: " : " entries, such as ") +
                  others.front() + "): train into an empty or new directory (--run-dir, or run.out_dir and run.name)");
}

std::string prepare_run_dir(const std::string& dir, const RunSpec& spec, int64_t resumed_step,
                            Checkpointer& checkpointer, const std::string& tokenizer_model, CutLog* cut) {
  *cut = CutLog{};
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) throw SpecError("run dir " + dir + ": cannot create (" + ec.message() + ")");
  try {
    write_file_atomically(dir + "/config.toml", resolved_toml(spec));
    if (!tokenizer_model.empty()) write_file_atomically(dir + "/" + kTokenizerFile, tokenizer_model);
  } catch (const std::runtime_error& e) {
    throw SpecError("run dir " + dir + ": cannot write config.toml or " + kTokenizerFile + " (" + e.what() + ")");
  }
  const std::string metrics = dir + "/metrics.jsonl", checkpoints = dir + "/checkpoints";
  if (resumed_step > 0) {
    *cut = truncate_metrics(metrics, resumed_step);
    checkpointer.discard_newer_than(resumed_step);
    return "resumed at step " + std::to_string(resumed_step);
  }
  std::string note;
  if (fs::exists(metrics, ec)) note = move_aside(metrics);
  // The history and the traces belong to the run that is set aside: a fresh start begins its own.
  for (const char* name : {"events.jsonl", "traces", "trace.json"}) {
    const std::string path = dir + "/" + name;
    if (fs::exists(path, ec)) note += (note.empty() ? "" : "; ") + move_aside(path);
  }
  if (fs::exists(checkpoints, ec) && !fs::is_empty(checkpoints, ec))
    note += (note.empty() ? "" : "; ") + move_aside(checkpoints);
  // Find out now, not after the first hour of training, that checkpoints cannot be written.
  fs::create_directories(checkpoints, ec);
  if (!fs::is_directory(checkpoints))
    throw SpecError("checkpoint dir " + checkpoints + ": cannot create (" +
                    (fs::exists(checkpoints) ? std::string("a file of that name is in the way") : ec.message()) + ")");
  try {
    const std::string probe = checkpoints + "/.probe";
    write_file_atomically(probe, "");
    fs::remove(probe, ec);
  } catch (const std::runtime_error& e) {
    throw SpecError("checkpoint dir " + checkpoints + ": not writable (" + e.what() + ")");
  }
  return note;
}

}  // namespace pipetrain
