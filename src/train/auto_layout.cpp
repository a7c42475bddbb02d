#include "pipetrain/train/auto_layout.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "pipetrain/compute/gpu.hpp"
#include "pipetrain/config/spec_schema.hpp"
#include "pipetrain/dist/launch.hpp"
#include "pipetrain/planner/auto_plan.hpp"
#include "pipetrain/train/calibrate.hpp"
#include "pipetrain/util/files.hpp"

namespace pipetrain {

// (reshard_after_forward only with zero 3: the pick sets it there, and elsewhere it is not read)
const std::vector<std::string> kAutoLayoutKeys = {"parallel.tp",        "parallel.pp",
                                                  "parallel.dp",        "parallel.micro_batches",
                                                  "parallel.schedule",  "parallel.virtual_stages",
                                                  "parallel.recompute", "parallel.partition",
                                                  "parallel.zero",      "parallel.sequence_parallel",
                                                  "parallel.ep"};

namespace {

// Each rank's share of its node's memory, or of its GPU's (rank 0's node speaks for all).
double memory_per_rank(const RunSpec& spec, const World& world) {
  if (spec.run.device != Device::gpu) return node_memory_bytes() / world.local_ranks();
  const int gpus = gpu::device_count();
  if (gpus == 0) return 0;  // start-up refuses run.device = gpu without one, naming it
  const int sharing = (world.local_ranks() + gpus - 1) / gpus;
  return static_cast<double>(gpu::device_info(world.local_rank() % gpus).memory_bytes) / sharing;
}

// The fewest ranks any node runs: a tensor group must fit in every node.
int fewest_ranks_per_node(const World& world) {
  std::map<std::string, int> per_node;
  for (const std::string& h : world.hosts()) ++per_node[h];
  int fewest = world.size();
  for (const auto& [node, ranks] : per_node) fewest = std::min(fewest, ranks);
  return fewest;
}

// "--set parallel.tp=1 --set parallel.pp=2 ...": ["parallel.tp=1", "parallel.pp=2", ...].
std::vector<std::string> overrides_of(const std::string& sets) {
  std::vector<std::string> out;
  std::istringstream words(sets);
  std::string word;
  while (words >> word)
    if (word != "--set") out.push_back(word);
  return out;
}

std::string value_of(const RunSpec& spec, const std::string& dotted) {
  const SpecKey* k = find_spec_key(dotted);
  return k ? k->show(spec) : "?";
}

// Rank 0's choice, as JSON for the others: the layout, or the reason there is none.
nlohmann::json decide(const RunSpec& spec, const World& world, const MachineCosts& costs) {
  const double budget = memory_per_rank(spec, world);
  const AutoPlan plan = auto_plan(spec, world.size(), costs, budget, 1, false, fewest_ranks_per_node(world));
  if (plan.best.empty()) {
    std::string why = "parallel.auto: no layout of " + std::to_string(world.size()) + " ranks fits";
    for (const std::string& b : plan.binding) why += "; " + b;
    return {{"error", why}};
  }
  const LayoutChoice& pick = plan.best.front();
  char reason[320];
  std::snprintf(reason, sizeof reason,
                "the fastest of %d layouts of %d ranks that fit %s per rank (%d considered): %.0f tokens/s "
                "predicted, step %.2f ms, %s on the fullest rank",
                plan.considered - plan.over_memory, world.size(), human_bytes(budget).c_str(), plan.considered,
                pick.predicted.tokens_per_s, 1e3 * pick.predicted.step_s, human_bytes(pick.memory_bytes).c_str());
  return {{"sets", pick.sets}, {"summary", pick.summary}, {"reason", reason}};
}

}  // namespace

AutoLayout choose_layout(const RunSpec& spec, World& world, const std::string& run_dir) {
  const std::string path = run_dir + "/costs.json";
  std::error_code ec;
  const bool kept = world.broadcast_from_root(std::filesystem::exists(path, ec) ? "kept" : "") == "kept";
  AutoLayout out;
  MachineCosts costs;
  std::string error;
  if (kept) {
    if (world.rank() == 0) try {
        costs = MachineCosts::read(path);
        costs.check_fits(spec, path);
      } catch (const SpecError& e) {
        error = std::string(e.what()) + " (the costs parallel.auto measured at the run's first launch)";
      }
  } else {
    costs = calibrate(spec, world);  // every rank measures, as they compute together in training
    out.measured = true;
  }
  nlohmann::json choice;
  if (world.rank() == 0) try {  // whatever happens here, the others wait for the broadcast
      choice = error.empty() ? decide(spec, world, costs) : nlohmann::json{{"error", error}};
    } catch (const std::exception& e) {
      choice = {{"error", std::string("parallel.auto: ") + e.what()}};
    }
  choice = nlohmann::json::parse(world.broadcast_from_root(world.rank() == 0 ? choice.dump() : ""));
  if (choice.contains("error")) throw SpecError(choice["error"].get<std::string>());
  out.ranks = world.size();
  out.overrides = overrides_of(choice["sets"].get<std::string>());
  out.summary = choice["summary"].get<std::string>();
  out.reason = choice["reason"].get<std::string>();
  if (world.rank() == 0) out.costs_json = costs.to_json().dump(2) + "\n";
  return out;
}

void credit_auto_layout(RunSpec& spec, const RunSpec& as_given, const AutoLayout& pick) {
  const std::string by = "parallel.auto (its pick for " + std::to_string(pick.ranks) + " ranks)";
  for (const std::string& key : kAutoLayoutKeys) {
    const std::string given = as_given.origin(key), chosen = value_of(spec, key), was = value_of(as_given, key);
    if (given != "(default)" && chosen != was)
      spec.notes.push_back(given + ": " + key + " = " + was + " is replaced by parallel.auto's " + chosen);
    auto& o = spec.origins;
    o.erase(std::remove_if(o.begin(), o.end(), [&](const auto& entry) { return entry.first == key; }), o.end());
    o.emplace_back(key, by);
  }
}

}  // namespace pipetrain
