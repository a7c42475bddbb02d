#include "pipetrain/tools/plan_command.hpp"
#include "pipetrain/tools/cli.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "pipetrain/dist/topology.hpp"
#include "pipetrain/planner/auto_plan.hpp"
#include "pipetrain/planner/launch_sizes.hpp"
#include "pipetrain/planner/plan.hpp"
#include "pipetrain/tools/costs_from_run.hpp"
#include "pipetrain/train/calibrate.hpp"
#include "pipetrain/train/run_spec.hpp"
#include "pipetrain/util/atomic_output.hpp"
#include "pipetrain/util/files.hpp"

namespace pipetrain {
namespace {

std::string number(double value) { return (std::ostringstream() << value).str(); }

// --calibrate writes a cost file: never over one of its inputs, over another cost file only with --force.
OutputRule costs_rule(const PlanOptions& opt) {
  std::vector<std::string> inputs;
  for (const std::string& in : {opt.config, opt.from_run})
    if (!in.empty()) inputs.push_back(in);
  return {"plan --calibrate", "--output", "a cost file", MachineCosts::is_cost_file, inputs, opt.force};
}

void write_costs(const PlanOptions& opt, const MachineCosts& costs, const char* no_messages) {
  write_file_atomically(opt.output, costs.to_json().dump(2) + "\n");
  std::printf(
      "%s\nwrote %s: per micro-batch of 1 sample, one block F %.3g ms, B %.3g ms, W %.3g ms; head F %.3g ms%s\n",
      costs.source.c_str(), std::filesystem::absolute(opt.output).c_str(), 1e3 * costs.block(1).f,
      1e3 * costs.block(1).b, 1e3 * costs.block(1).w, 1e3 * costs.head(1).f, costs.p2p.empty() ? no_messages : "");
  if (!opt.output_given)
    std::printf("(the default --output, in the current folder; --output FILE puts it elsewhere)\n");
}

void check_machine_options(const PlanOptions& opt) {
  for (const auto& [option, value] : {std::pair{"peak-tflops", opt.peak_tflops}, std::pair{"link-gbps", opt.link_gbps},
                                      std::pair{"node-link-gbps", opt.node_link_gbps}})
    if (value && !(*value > 0 && std::isfinite(*value)))
      throw SpecError(std::string("--") + option + " " + number(*value) + " is not a positive number");
  if (opt.peak_tflops.has_value() != opt.link_gbps.has_value())
    throw SpecError("--peak-tflops and --link-gbps describe a machine together: give both");
  if (opt.node_link_gbps && !opt.peak_tflops)
    throw SpecError("--node-link-gbps goes with --peak-tflops and --link-gbps (a cost file measures its own links)");
  if (!(opt.efficiency > 0 && opt.efficiency <= 1))
    throw SpecError("--efficiency " + number(opt.efficiency) + " must be in (0, 1]");
}

// The costs the predictions use: a cost file or a run's trace (--costs), the machine described
// (--peak-tflops, --link-gbps), or none.
std::optional<MachineCosts> chosen_costs(const PlanOptions& opt, const RunSpec& spec) {
  if (!opt.costs.empty()) {
    MachineCosts costs =
        std::filesystem::is_directory(opt.costs) ? costs_from_run(opt.costs) : MachineCosts::read(opt.costs);
    costs.check_fits(spec, "--costs " + opt.costs);
    return costs;
  }
  if (opt.peak_tflops)
    return MachineCosts::from_peak(spec, *opt.peak_tflops * 1e12, opt.efficiency, *opt.link_gbps * 1e9,
                                   opt.node_link_gbps.value_or(0) * 1e9);
  return std::nullopt;
}

// What --auto's options must say together: how many ranks (--world, or --nodes with
// --ranks-per-node), and for --sbatch the tasks per node and the spec file the job reads.
void check_auto_options(const PlanOptions& opt) {
  if (!opt.automatic) {
    if (!opt.nodes.empty() || opt.sbatch)
      throw SpecError(std::string(opt.sbatch ? "--sbatch" : "--nodes") + " goes with --auto (the layout it plans)");
    return;
  }
  if (opt.world > 0 && !opt.nodes.empty()) throw SpecError("--world and --nodes both say how many ranks: give one");
  if (opt.world < 1 && opt.nodes.empty())
    throw SpecError("plan --auto needs --world N, or --nodes MIN-MAX with --ranks-per-node K: the ranks to lay out");
  if (!opt.ranks_per_node && (!opt.nodes.empty() || opt.sbatch))
    throw SpecError(std::string(opt.sbatch ? "--sbatch" : "--nodes") +
                    " needs --ranks-per-node K: the tasks each node runs (sbatch --ntasks-per-node)");
  if (opt.sbatch && opt.config.empty())
    throw SpecError("--sbatch needs --config FILE: the job reads its spec from that file");
  if (opt.sbatch && opt.world > 0 && opt.world % *opt.ranks_per_node != 0)
    throw SpecError("--world " + std::to_string(opt.world) + " is not a multiple of --ranks-per-node " +
                    std::to_string(*opt.ranks_per_node) + ": a job's nodes each run as many tasks");
}

ExitCode print_auto_plan(const PlanOptions& opt, const RunSpec& spec, const std::optional<MachineCosts>& costs,
                         double capacity) {
  if (!costs)
    throw SpecError(
        "plan --auto predicts step times: give --costs FILE (plan --calibrate) or --peak-tflops and --link-gbps");
  const bool search_batch = opt.global_batch == "auto";
  const JobRequest job{opt.config, opt.overrides, opt.ranks_per_node.value_or(0)};
  const JobRequest* sbatch = opt.sbatch ? &job : nullptr;
  if (!opt.nodes.empty()) {
    const std::vector<SizePlan> sizes =
        plan_sizes(spec, parse_node_range(opt.nodes), *opt.ranks_per_node, *costs, capacity, search_batch);
    std::cout << (opt.json ? sizes_json(sizes, *costs, sbatch) : sizes_text(sizes, spec, *costs, sbatch));
    const bool any = std::any_of(sizes.begin(), sizes.end(), [](const SizePlan& s) { return !s.plan.best.empty(); });
    return any ? ExitCode::ok : ExitCode::bad_input;
  }
  AutoPlan best =
      auto_plan(spec, opt.world, *costs, capacity, 5, search_batch, opt.ranks_per_node.value_or(kMaxTensorRanks));
  add_scaling_line(best, spec, opt.world, *costs, capacity, search_batch);
  const std::string submit =
      sbatch && !best.best.empty() ? sbatch_line(job, opt.world / job.ranks_per_node, best.best.front()) : "";
  if (opt.json) {
    nlohmann::json j = nlohmann::json::parse(auto_plan_json(best, opt.world, *costs, capacity));
    if (!submit.empty()) j["sbatch"] = submit;
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << auto_plan_text(best, opt.world, *costs, capacity);
    if (!submit.empty()) std::cout << "submit it with:\n  " << submit << "\n";
  }
  return best.best.empty() ? ExitCode::bad_input : ExitCode::ok;
}

void print_plan(const PlanOptions& opt, const RunSpec& spec, const std::optional<MachineCosts>& costs,
                double capacity) {
  const Plan plan = make_plan(spec);
  const std::optional<ImbalanceWarning> warning = imbalance_warning(spec, plan);
  if (opt.json) {
    nlohmann::json j = plan_json(spec, plan);
    if (costs) j["budget"] = budget_json(spec, plan, *costs, capacity);
    if (warning) j["warning"] = {{"cause", warning->cause}, {"advice", warning->advice}};
    std::cout << j.dump(2) << "\n";
    return;
  }
  std::cout << plan_text(spec, plan);
  if (warning) std::cout << "\nwarning: " << warning->cause << "\n  " << warning->advice << "\n";
  if (costs) {
    std::cout << budget_text(spec, plan, *costs, capacity);
  } else {
    std::cout << "\n(cost of a step and of the run: give --costs FILE from plan --calibrate, or --peak-tflops and "
                 "--link-gbps)\n";
  }
}

}  // namespace

double parse_bytes(const std::string& text, const std::string& option) {
  size_t used = 0;
  double value = -1;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
  }
  std::string unit = text.substr(used);
  unit.erase(0, unit.find_first_not_of(' '));
  const std::pair<const char*, double> units[] = {
      {"", 1},      {"B", 1},        {"KB", 1e3},        {"MB", 1e6},           {"GB", 1e9},
      {"TB", 1e12}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  for (const auto& [name, scale] : units)
    if (unit == name && value > 0) return value * scale;
  throw SpecError(option + " " + text + ": not a byte count (e.g. 80GiB, 141e9, 64GB)");
}

ExitCode run_plan(const PlanOptions& opt) {
  if (opt.ranks_per_node && *opt.ranks_per_node < 1)
    throw SpecError("--ranks-per-node " + std::to_string(*opt.ranks_per_node) + " must be at least 1");
  check_auto_options(opt);
  if (!opt.global_batch.empty() && (opt.global_batch != "auto" || !opt.automatic))
    throw SpecError("--global-batch " + opt.global_batch +
                    ": only 'auto', with --auto (a fixed one is --set train.global_batch=N)");
  if (!opt.from_run.empty())
    throw SpecError("--from-run goes with --calibrate (plan --costs takes a run directory itself)");
  // --auto replaces the layout: the spec is read for its model, batch and data, on one rank.
  const RunSpec spec = load_run_spec(opt.config, opt.overrides, opt.automatic ? kAnyLayout : opt.world,
                                     "ranks are planned (plan --world)");
  const double capacity = opt.memory_per_rank.empty() ? 0 : parse_bytes(opt.memory_per_rank, "--memory-per-rank");
  check_machine_options(opt);
  const std::optional<MachineCosts> costs = chosen_costs(opt, spec);
  if (opt.automatic) return print_auto_plan(opt, spec, costs, capacity);
  if (opt.compare_schedules) {
    std::cout << schedule_comparison(spec);
    return ExitCode::ok;
  }
  print_plan(opt, spec, costs, capacity);
  if (spec.parallel.automatic && !opt.json)
    std::cout << "\nnote: parallel.auto = true: each launch lays the run out on its own ranks; this plans the layout "
                 "keys as written (plan --auto --world N shows the choice)\n";
  if (opt.ranks_per_node) {
    const Topology layout =
        Topology::of(0, spec.parallel.pp, spec.parallel.dp, spec.parallel.order, false, spec.parallel.tp);
    std::cout << "\n" << node_map(nodes_filled_in_order(layout.world_size(), *opt.ranks_per_node), layout);
  }
  return ExitCode::ok;
}

ExitCode run_calibrate_from_run(const PlanOptions& opt) {
  check_output(opt.output, costs_rule(opt));
  write_costs(opt, costs_from_run(opt.from_run), " (from a run's trace: no message costs)");
  return ExitCode::ok;
}

ExitCode run_calibrate(const PlanOptions& opt, World& world) {
  world.require_agreed([&] {
    if (world.rank() == 0) check_output(opt.output, costs_rule(opt));
  });
  const MachineCosts costs = calibrate(load_spec(opt.config, opt.overrides, 0), world);
  if (world.rank() == 0) write_costs(opt, costs, " (one rank: no message costs; launch on 2+ ranks to measure them)");
  return ExitCode::ok;
}

ExitCode plan_command(const std::vector<std::string>& args) {
  PlanOptions opt;
  double peak_tflops = 0, link_gbps = 0, node_link_gbps = 0;
  std::string global_batch;
  po::options_description desc("pipetrain plan [options]   (no MPI launch needed)");
  desc.add_options()("help,h", "show this help")("config", po::value<std::string>(&opt.config), "run spec (TOML)")(
      "set", po::value<std::vector<std::string>>(&opt.overrides)->composing(), "override one key (repeatable)")(
      "world", po::value<int>(&opt.world),
      "rank count to plan for (parallel.dp, when unset, takes the ranks tp x pp leave; default tp x pp x dp)")(
      "json", "print the prediction as JSON")(
      "compare-schedules", "one line per pipeline schedule for this layout: bubble and activation peak")(
      "ranks-per-node", po::value<int>(),
      "show the node map and the traffic crossing nodes when each node runs "
      "this many consecutive ranks")(
      "calibrate",
      "measure this machine's costs for the spec's model (kernels; messages when launched on 2+ "
      "ranks) and write them to --output")("from-run", po::value<std::string>(&opt.from_run),
                                           "with --calibrate: take the costs from a finished run's "
                                           "trace (RUN_DIR, trained with log.trace_steps > 0) instead of measuring")(
      "output", po::value<std::string>(&opt.output)->default_value(opt.output),
      "where --calibrate writes its cost file")("force", "--calibrate: replace an existing cost file")(
      "costs", po::value<std::string>(&opt.costs),
      "a cost file from --calibrate, or a finished run's directory (its "
      "trace): predict the step time and the run's cost")("peak-tflops", po::value<double>(&peak_tflops),
                                                          "for a machine not at hand: each rank's peak TFLOP/s ...")(
      "link-gbps", po::value<double>(&link_gbps), "... and its link bandwidth in GB/s")(
      "node-link-gbps", po::value<double>(&node_link_gbps),
      "... and within a node (NVLink: a tensor group's link; default --link-gbps)")(
      "efficiency", po::value<double>(&opt.efficiency),
      "... and the share of the peak the kernels reach (default 0.5)")(
      "memory-per-rank", po::value<std::string>(&opt.memory_per_rank),
      "each rank's device or node memory, e.g. "
      "141GiB: checked against the largest stage's need")(
      "auto",
      "pick the layout: every tp x pp x dp = --world, micro-batches, schedule, chunks, recompute, partition, "
      "zero and (a mixture of experts) ep, within --memory-per-rank, ranked by the tokens/s predicted with --costs (or "
      "the peak); says what binds")(
      "global-batch", po::value<std::string>(&global_batch),
      "with --auto: 'auto' searches train.global_batch too (the spec's x 1, 2, 4, 8, 16)")(
      "nodes", po::value<std::string>(&opt.nodes),
      "with --auto and --ranks-per-node K: plan each node count of MIN-MAX (or one), K ranks a node: "
      "each size's best layout, tokens/s and memory")(
      "sbatch",
      "with --auto and --ranks-per-node: print the sbatch line (nodes, tasks per node, time limit, overrides) "
      "that runs each pick");
  po::variables_map vm;
  if (auto done = parse_command_line("plan", desc, args, vm)) return *done;
  opt.json = vm.count("json") > 0;
  opt.compare_schedules = vm.count("compare-schedules") > 0;
  if (vm.count("ranks-per-node")) opt.ranks_per_node = vm["ranks-per-node"].as<int>();
  opt.automatic = vm.count("auto") > 0;
  opt.global_batch = vm.count("global-batch") ? global_batch : "";
  opt.sbatch = vm.count("sbatch") > 0;
  if (vm.count("peak-tflops")) opt.peak_tflops = peak_tflops;
  if (vm.count("link-gbps")) opt.link_gbps = link_gbps;
  if (vm.count("node-link-gbps")) opt.node_link_gbps = node_link_gbps;
  opt.calibrate = vm.count("calibrate") > 0;
  opt.output_given = !vm["output"].defaulted();
  opt.force = vm.count("force") > 0;
  if (opt.calibrate && !opt.from_run.empty()) return run_offline([&] { return run_calibrate_from_run(opt); });
  if (opt.calibrate) return run_mpi([&](World& world) { return run_calibrate(opt, world); });
  return run_offline([&] { return run_plan(opt); });
}

}  // namespace pipetrain
