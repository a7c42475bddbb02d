#include "pipetrain/tools/report.hpp"
#include "pipetrain/tools/cli.hpp"

#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "pipetrain/compute/precision.hpp"
#include "pipetrain/tools/run_summary.hpp"
#include "pipetrain/util/atomic_output.hpp"

extern char** environ;

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace pipetrain {
namespace {

// printf of one value, "n/a" when the log did not have it (older or cut-short runs).
std::string fmt(const char* format, double v) {
  if (std::isnan(v)) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string mib(double b) { return fmt("%.2f MiB", b / (1 << 20)); }

// "gemm 78.0% (201 GFLOP/s), attention 10.1%, ..., waiting 5.2%, other 0.4%"
std::string shares_text(const StageFigures& f) {
  std::string out;
  for (const auto& [name, share] : f.step_shares) {
    out += (out.empty() ? "" : ", ") + name + " " + fmt("%.1f%%", 100 * share);
    if (name == "gemm") out += " (" + fmt("%.0f", f.gemm_gflops) + " GFLOP/s)";
  }
  return out;
}

// A mixture of experts: how evenly each MoE block's router spreads its tokens.
void text_routing(const RunSummary& r, std::string& out) {
  if (!r.routing) return;
  const RunSummary::Routing& m = *r.routing;
  out += "  experts: busiest expert's share over the mean (1 = balanced), per MoE block, last step (median):";
  for (size_t b = 0; b < m.blocks.size(); ++b)
    out += " " + std::to_string(m.blocks[b]) + ": " + fmt("%.2f", m.load_last[b]) + " (" +
           fmt("%.2f", m.load_median[b]) + ")";
  double dropped = 0;
  for (double d : m.dropped_last) dropped = std::max(dropped, d);
  out += "\n    load-balancing loss " + fmt("%.4f", m.aux_first) + " -> " + fmt("%.4f", m.aux_last) +
         (r.spec ? " (balanced: " + std::to_string(r.spec->model.moe.top_k) + ")" : "") +
         (dropped > 0 ? "; dropped at most " + fmt("%.1f%%", 100 * dropped) + " of a block's choices" : "") + "\n";
}

void text_measured(const RunSummary& r, std::string& out) {
  if (r.logged_steps == 0) return;
  if (r.spec)
    out +=
        "  progress: " + std::to_string(r.last_step) + " of " + std::to_string(r.spec->run.steps) + " steps" +
        (r.last_step >= r.spec->run.steps ? " (complete)" : " (incomplete: stopped or killed; resume continues it)") +
        "\n";
  out += "  loss: " + fmt("%.4f", r.first_loss) + " at step " + std::to_string(r.first_step) + " -> " +
         fmt("%.4f", r.last_loss) + " at step " + std::to_string(r.last_step) + "\n";
  if (r.latest_val)
    out += "  val_loss: " + fmt("%.4f", r.latest_val->loss) + " at step " + std::to_string(r.latest_val->step) +
           " (best " + fmt("%.4f", r.best_val->loss) + " at step " + std::to_string(r.best_val->step) + ")\n";
  if (r.latest_val && !r.latest_val->by_source.empty()) {
    out += "    by source:";
    for (const auto& [name, loss] : r.latest_val->by_source) out += " " + name + " " + fmt("%.4f", loss);
    out += "\n";
  }
  text_routing(r, out);
  out += "  step time: median " + fmt("%.1f ms", 1e3 * r.step_time_s) + ", " + fmt("%.0f", r.tokens_per_s) +
         " tokens/s, " + fmt("%.1f", r.gflops) + " GFLOP/s, MFU " + fmt("%.1f%%", 100 * r.mfu) + " (" +
         fmt("%.0f%%", 100 * r.sgemm_share) + " of " + gemm_name(r.spec ? r.spec->model.dtype : Dtype::fp32) + ")\n";
}

void text_stages(const RunSummary& r, std::string& out) {
  if (r.stages == 0) return;
  if (r.spec && !r.predicted)
    out += "  per stage: of the logged steps' layout, " + grid_text(r.spec->parallel.tp, r.stages, r.logged_dp) +
           " (config.toml's " + grid_text(r.spec->parallel.tp, r.spec->parallel.pp, r.spec->parallel.dp) +
           " logged no step: no prediction)\n";
  if (r.predicted)
    out += "  bubble of the " + r.spec->parallel.schedule->name +
           " schedule with even stages = " + fmt("%.3f", r.bubble_theory) +
           "; per stage: measured median vs simulated\n";
  if (const auto& l = r.oversubscribed)
    out += "    (the launch measured ran " + std::to_string(l->ranks_per_node) + " ranks x " +
           std::to_string(l->threads_per_rank) + " threads on a node of " + std::to_string(l->node_cores) +
           " cores: time a rank waited for a core is measured as bubble, which the simulation does not count)\n";
  if (r.earlier_layout_steps)
    out += "    (" + std::to_string(r.earlier_layout_steps) +
           " logged steps of an earlier layout left out of the per-stage figures)\n";
  for (size_t s = 0; s < r.stages; ++s) {
    const StageFigures& f = r.per_stage[s];
    out += "    stage " + std::to_string(s) + ": bubble " + fmt("%.3f", f.bubble);
    if (r.predicted) out += " (sim " + fmt("%.3f", f.bubble_sim) + ")";
    out += " | activations " + mib(f.act_peak_bytes);
    if (r.predicted) out += " (plan " + mib(f.act_plan_bytes) + ")";
    out += " | RSS " + mib(f.rss_bytes) + " | params+grads+AdamW " + mib(f.state_bytes) + "\n";
    if (f.reduced_bytes > 0)
      out += "      data-parallel exchanges a step: " + mib(f.reduced_bytes) + " reduced, " + mib(f.gathered_bytes) +
             " gathered, " + fmt("%.1f", 1e3 * f.dp_comm_s) + " ms on the link, of it " +
             fmt("%.1f", 1e3 * f.dp_wait_s) + " ms waited for (exposed)\n";
    if (!f.step_shares.empty()) out += "      step by kernel: " + shares_text(f) + "\n";
  }
}

std::string report_text(const RunSummary& r) {
  std::string out = "run " + r.run_dir + "\n";
  if (const auto& s = r.spec)
    out += "  spec: " + grid_text(s->parallel.tp, s->parallel.pp, s->parallel.dp) +
           ", M=" + std::to_string(s->parallel.micro_batches) + ", recompute " + name_of(s->parallel.recompute) + ", " +
           std::to_string(s->run.steps) + " steps, " + std::to_string(s->model.n_layer) + "-block " +
           (s->model.arch == Arch::llama ? "Llama" : "GPT-2") + " d_model " + std::to_string(s->model.d_model) +
           (s->model.moe.on()
                ? ", " + std::to_string(s->model.moe.experts) + " experts, top-" + std::to_string(s->model.moe.top_k)
                : "") +
           "\n";
  text_measured(r, out);
  text_stages(r, out);
  out += r.stragglers.text + describe(r.story) + describe(r.ledger);
  if (!r.checkpoints.empty()) {
    out += "  checkpoints:";
    for (const std::string& n : r.checkpoints) out += " " + n;
    out += "\n    latest " + (r.latest_checkpoint.empty() ? "?" : r.latest_checkpoint) + ": " +
           (r.latest_problem.empty() ? "intact" : r.latest_problem) + "\n";
  }
  if (!r.trace.empty()) out += "  trace: " + r.trace + " (open in Perfetto / chrome://tracing)\n";
  for (const std::string& m : r.missing) out += "  missing: " + m + "\n";
  return out;
}

json stage_json(const StageFigures& f) {
  json shares = json::object();
  for (const auto& [name, share] : f.step_shares) shares[name] = share;
  return {{"bubble", f.bubble},
          {"bubble_sim", f.bubble_sim},
          {"act_peak_bytes", f.act_peak_bytes},
          {"act_plan_bytes", f.act_plan_bytes},
          {"rss_bytes", f.rss_bytes},
          {"state_bytes", f.state_bytes},
          {"dp_wait_s", f.dp_wait_s},
          {"dp_comm_s", f.dp_comm_s},
          {"reduced_bytes", f.reduced_bytes},
          {"gathered_bytes", f.gathered_bytes},
          {"step_shares", shares},
          {"gemm_gflops", f.gemm_gflops}};
}

// The same facts as report_text, NaN (a figure the log lacks) as null.
json report_json(const RunSummary& r) {
  json doc = {{"run_dir", r.run_dir}};
  if (const auto& s = r.spec)
    doc["spec"] = {{"tp", s->parallel.tp},
                   {"pp", s->parallel.pp},
                   {"dp", s->parallel.dp},
                   {"micro_batches", s->parallel.micro_batches},
                   {"recompute", name_of(s->parallel.recompute)},
                   {"steps", s->run.steps},
                   {"n_layer", s->model.n_layer},
                   {"d_model", s->model.d_model},
                   {"schedule", s->parallel.schedule->name}};
  if (r.logged_steps) {
    doc["progress"] = {{"step", r.last_step},
                       {"of", r.spec ? json(r.spec->run.steps) : json(nullptr)},
                       {"complete", r.spec && r.last_step >= r.spec->run.steps}};
    doc["loss"] = {
        {"first", r.first_loss}, {"first_step", r.first_step}, {"last", r.last_loss}, {"last_step", r.last_step}};
    if (r.latest_val)
      doc["val_loss"] = {{"latest", r.latest_val->loss},
                         {"latest_step", r.latest_val->step},
                         {"best", r.best_val->loss},
                         {"best_step", r.best_val->step}};
    if (r.latest_val && !r.latest_val->by_source.empty()) {
      nlohmann::ordered_json by_source = nlohmann::ordered_json::object();
      for (const auto& [name, loss] : r.latest_val->by_source) by_source[name] = loss;
      doc["val_loss"]["latest_by_source"] = by_source;
    }
    if (r.routing)
      doc["moe"] = {{"blocks", r.routing->blocks},
                    {"load_max_last", r.routing->load_last},
                    {"load_max_median", r.routing->load_median},
                    {"dropped_last", r.routing->dropped_last},
                    {"aux_loss_first", r.routing->aux_first},
                    {"aux_loss_last", r.routing->aux_last}};
    doc["step_time_median_s"] = r.step_time_s;
    doc["tokens_per_s_median"] = r.tokens_per_s;
    doc["gflops_median"] = r.gflops;
    doc["mfu_median"] = r.mfu;
    doc["sgemm_share_median"] = r.sgemm_share;
  }
  if (r.stages) {
    doc["layout"] = {{"pp", r.stages},
                     {"dp", r.logged_dp},
                     {"predicted", r.predicted},
                     {"bubble_theory", r.bubble_theory},
                     {"earlier_layout_steps", r.earlier_layout_steps},
                     {"oversubscribed", r.oversubscribed.has_value()}};
    doc["stages"] = json::array();
    for (const StageFigures& f : r.per_stage) doc["stages"].push_back(stage_json(f));
  }
  if (!r.stragglers.json.is_null()) doc["stragglers"] = r.stragglers.json;
  doc["history"] = to_json(r.story);
  doc["ledger"] = r.ledger.launches.empty() ? json(nullptr) : to_json(r.ledger);
  if (!r.checkpoints.empty())
    doc["checkpoints"] = {
        {"saved", r.checkpoints}, {"latest", r.latest_checkpoint}, {"intact", r.latest_problem.empty()}};
  doc["trace"] = r.trace.empty() ? json(nullptr) : json(r.trace);
  doc["missing"] = r.missing;
  return doc;
}

// scripts/analysis/plots.py next to the sources this binary was built from, or PIPETRAIN_SCRIPTS.
std::string plots_script() {
  if (const char* d = std::getenv("PIPETRAIN_SCRIPTS")) return std::string(d) + "/plots.py";
  return std::string(PIPETRAIN_SOURCE_DIR) + "/scripts/analysis/plots.py";
}

// What --plots may replace: a folder of plots.py's PNG files and nothing else.
bool is_plots_folder(const std::string& dir) {
  return folder_holds_only(dir, [](const std::string& name) { return fs::path(name).extension() == ".png"; });
}

// Runs the plotter as its own process with an argument vector (no shell: any character in a path
// is only that character); returns "" when it drew, else what went wrong.
std::string draw_plots(const RunSummary& r, const std::string& staging, const std::string& shown_as) {
  std::vector<std::string> args = {"/usr/bin/python3", plots_script(), r.run_dir, staging, "--shown-as", shown_as};
  if (r.predicted) {  // bubble.png draws the simulation's bubble of each stage too
    std::string sims;
    for (size_t s = 0; s < r.per_stage.size(); ++s) sims += (s ? "," : "") + fmt("%.6f", r.per_stage[s].bubble_sim);
    args.insert(args.end(), {"--sim-bubble", sims});
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);  // the report before the plotter's lines
  pid_t pid = 0;
  if (const int err = posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ))
    return std::string("cannot start ") + argv[0] + ": " + std::strerror(err);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  return WIFEXITED(status) ? "plots.py exited " + std::to_string(WEXITSTATUS(status)) : "plots.py was killed";
}

}  // namespace

ExitCode run_report(const std::string& run_dir, const std::string& plots_dir, bool as_json) {
  const RunSummary summary = summarize_run(run_dir);  // refuses a path that is no run directory
  // The plots are drawn into a staging folder and renamed into place whole.
  std::optional<AtomicOutput> plots;
  if (!plots_dir.empty())
    plots.emplace(
        plots_dir,
        OutputRule{"report", "--plots", "a folder of report plots (PNG files only)", is_plots_folder, {run_dir}, true});
  std::fputs(as_json ? (report_json(summary).dump(2) + "\n").c_str() : report_text(summary).c_str(), stdout);
  if (!plots) return ExitCode::ok;
  if (const std::string problem = draw_plots(summary, plots->staging(), plots_dir); !problem.empty()) {
    report_error("plotting failed (" + problem +
                 "); it needs /usr/bin/python3 with matplotlib (Debian: python3-matplotlib)");
    return ExitCode::fault;
  }
  plots->commit();
  return ExitCode::ok;
}

ExitCode report_command(const std::vector<std::string>& args) {
  std::string run_dir, plots;
  po::options_description desc("pipetrain report RUN_DIR [options]");
  desc.add_options()("help,h", "show this help")("run-dir", po::value<std::string>(&run_dir), "run directory")(
      "plots", po::value<std::string>(&plots), "also write PNG plots there (needs /usr/bin/python3 + matplotlib)")(
      "json", "print the figures as one JSON document instead of text (for scripts)");
  po::positional_options_description pos;
  pos.add("run-dir", 1);
  po::variables_map vm;
  if (auto done = parse_command_line("report", desc, args, vm, pos)) return *done;
  if (run_dir.empty()) {
    std::fprintf(stderr, "pipetrain report: error: which run directory? (pipetrain report RUN_DIR)\n");
    return ExitCode::bad_input;
  }
  return run_offline([&] { return run_report(run_dir, plots, vm.count("json") > 0); });
}

}  // namespace pipetrain
