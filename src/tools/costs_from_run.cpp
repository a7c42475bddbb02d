#include "pipetrain/tools/costs_from_run.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "pipetrain/model/model.hpp"
#include "pipetrain/model/partition.hpp"
#include "pipetrain/util/errors.hpp"
#include "pipetrain/util/files.hpp"
#include "pipetrain/util/stats.hpp"

namespace pipetrain {
namespace {

// What a virtual stage holds.
struct Shape {
  int blocks;
  bool first, last;
};

// The FLOPs of one pass through a virtual stage, `unit` holding the parts' FLOPs per sample.
double flops(const MachineCosts::AtSize& unit, const Shape& s, double PassCosts::*pass) {
  return stage_passes(unit.block, unit.embed, unit.head, s.blocks, s.first, s.last).*pass;
}

// One kind of pass (forward, input gradient, ...) shared out over a block, the embedding and the
// head: `t` its seconds per virtual stage.
struct Parts {
  double block = 0, embed = 0, head = 0;
};
Parts share_out(const std::vector<double>& t, const std::vector<Shape>& shapes, const MachineCosts::AtSize& per_sample,
                double PassCosts::*pass) {
  const Parts unit{per_sample.block.*pass, per_sample.embed.*pass, per_sample.head.*pass};
  std::vector<double> per_block;
  for (size_t v = 0; v < shapes.size(); ++v)
    if (!shapes[v].first && !shapes[v].last && shapes[v].blocks > 0) per_block.push_back(t[v] / shapes[v].blocks);
  Parts p;
  if (per_block.empty()) {  // no stage times a block alone: the FLOPs' proportions throughout
    double time = 0, work = 0;
    for (size_t v = 0; v < shapes.size(); ++v) {
      time += t[v];
      work += flops(per_sample, shapes[v], pass);
    }
    const double s = work > 0 ? time / work : 0;
    return {unit.block * s, unit.embed * s, unit.head * s};
  }
  p.block = median(per_block);
  for (size_t v = 0; v < shapes.size(); ++v) {
    const Shape& s = shapes[v];
    if (!s.first && !s.last) continue;
    const double rest = std::max(0.0, t[v] - s.blocks * p.block);  // the embedding's and/or the head's
    const double e = s.first ? unit.embed : 0, h = s.last ? unit.head : 0;
    if (e + h > 0) {
      if (s.first) p.embed = rest * e / (e + h);
      if (s.last) p.head = rest * h / (e + h);
    }
  }
  return p;
}

// What a run's trace holds for the cost file: its forward, backward and recompute spans, and per
// rank (stage * dp count + dp) and step the seconds of the update (zeroing the gradients, their
// norm and AdamW).
struct Span {
  char op;  // F, B (fused), W; B becomes b (the split input half) where the same pass has a W
  int stage, dp, step, chunk, mb;
  double seconds;
};
struct TraceFigures {
  std::vector<Span> spans;
  std::map<int, std::map<int, double>> update;
  int last_step = 0;
};

TraceFigures read_trace(const std::string& trace_file, const RunSpec& spec) {
  nlohmann::json trace;
  try {
    trace = nlohmann::json::parse(read_input_file(trace_file, "the run's trace"));
  } catch (const nlohmann::json::exception& e) {
    throw SpecError(trace_file + ": not a trace (" + e.what() + ")");
  }
  TraceFigures t;
  for (const auto& e : trace.value("traceEvents", nlohmann::json::array())) {
    if (e.value("ph", "") != "X") continue;
    const std::string name = e.value("name", ""), cat = e.value("cat", "");
    const int stage = e.value("pid", 0), dp = e.value("tid", 0), step = e.at("args").value("step", 0);
    t.last_step = std::max(t.last_step, step);
    const double seconds = e.value("dur", 0.0) * 1e-6;
    if (name == "zero grads" || name == "gradient norm" || name == "optimizer")
      t.update[stage * spec.parallel.dp + dp][step] += seconds;
    if (cat != "forward" && cat != "backward" && cat != "recompute") continue;
    int mb = 0, chunk = 0;
    if (std::sscanf(name.c_str() + 1, "%d.%d", &mb, &chunk) < 1) continue;
    t.spans.push_back({name[0], stage, dp, step, chunk, mb, seconds});
  }
  if (t.spans.empty())
    throw SpecError(trace_file + ": no forward or backward spans (train with log.trace_steps > 0 to measure)");
  return t;
}

}  // namespace

MachineCosts costs_from_run(const std::string& run_dir) {
  const std::string config = run_dir + "/config.toml", trace_file = run_dir + "/trace.json";
  const RunSpec spec = load_spec(config, {}, kAnyLayout);
  // A cost file holds the whole model's passes; a tensor rank's are its part plus the group's sums.
  if (spec.parallel.tp > 1)
    throw SpecError(run_dir + ": trained with parallel.tp = " + std::to_string(spec.parallel.tp) +
                    ", whose passes are a tensor rank's part of each: take costs from a run with tp = 1 (or plan "
                    "--calibrate)");
  const TraceFigures trace = read_trace(trace_file, spec);
  const std::vector<Span>& spans = trace.spans;
  const int last_step = trace.last_step;
  const ChunkPlacement placement = spec.chunk_placement();
  const int VS = placement.virtual_stages();
  const int first_step = last_step > 1 ? 2 : 1;         // the first step also sizes every buffer
  std::set<std::tuple<int, int, int, int, int>> split;  // (stage, dp, step, chunk, mb) whose backward has a W
  for (const Span& s : spans)
    if (s.op == 'W') split.insert({s.stage, s.dp, s.step, s.chunk, s.mb});
  std::vector<std::map<char, std::vector<double>>> by_vstage(VS);
  for (const Span& s : spans) {
    if (s.step < first_step || s.stage >= placement.stages || s.chunk >= placement.chunks) continue;
    char op = s.op;
    if (op == 'B' && split.count({s.stage, s.dp, s.step, s.chunk, s.mb})) op = 'b';
    by_vstage[placement.vstage(s.stage, s.chunk)][op].push_back(s.seconds);
  }

  const std::vector<int> blocks = partition_blocks(spec);
  std::vector<Shape> shapes;
  for (int v = 0; v < VS; ++v) shapes.push_back({blocks[v], v == 0, v == VS - 1});
  const MachineCosts::AtSize unit = MachineCosts::flops_per_sample(spec);
  std::vector<double> f(VS), b(VS), w(VS), r(VS);
  for (int v = 0; v < VS; ++v) {
    auto& m = by_vstage[v];
    if (m['F'].empty()) throw SpecError(trace_file + ": no forward of virtual stage " + std::to_string(v) + " traced");
    f[v] = median(m['F']);
    r[v] = m['R'].empty() ? 0 : median(m['R']);  // no recompute: none traced
    if (!m['b'].empty()) {
      b[v] = median(m['b']);
      w[v] = median(m['W']);
    } else {  // fused: input and weight halves in their FLOPs' proportions
      const double fb = flops(unit, shapes[v], &PassCosts::b), fw = flops(unit, shapes[v], &PassCosts::w);
      b[v] = median(m['B']) * fb / (fb + fw);
      w[v] = median(m['B']) * fw / (fb + fw);
    }
  }
  const Parts F = share_out(f, shapes, unit, &PassCosts::f), B = share_out(b, shapes, unit, &PassCosts::b),
              W = share_out(w, shapes, unit, &PassCosts::w);
  const Parts R = share_out(r, shapes, unit, &PassCosts::f);  // a recompute re-runs forwards

  MachineCosts c = MachineCosts::for_model(spec);
  char what[256];
  std::snprintf(what, sizeof what, "the trace of run %s (%s, %s, M = %d, recompute %s), steps %d-%d", run_dir.c_str(),
                grid_text(spec.parallel.tp, spec.parallel.pp, spec.parallel.dp).c_str(),
                spec.parallel.schedule->name.c_str(), spec.parallel.micro_batches, name_of(spec.parallel.recompute),
                first_step, last_step);
  c.source = what;
  MachineCosts::AtSize at;
  at.samples = spec.samples_per_micro_batch();
  at.block = {F.block, B.block, W.block};
  at.embed = {F.embed, B.embed, W.embed};
  at.head = {F.head, B.head, W.head};
  if (spec.parallel.recompute != Recompute::none)  // the other mode stays unmeasured (0)
    at.block_recompute[spec.parallel.recompute == Recompute::block ? 0 : 1] = {F.block, R.block + B.block + W.block, 0};
  c.compute = {at};

  std::vector<double> per_param;
  for (const auto& [rank, by_step] : trace.update) {
    const int stage = rank / spec.parallel.dp;
    std::vector<double> seconds;
    for (const auto& [step, s] : by_step)
      if (step >= first_step) seconds.push_back(s);
    size_t params = 0;
    for (const ParamTensor& t : rank_params(spec, chunks_of(blocks, placement, stage), VS)) params += t.size;
    const double updated = spec.parallel.zero ? static_cast<double>(params) / spec.parallel.dp : params;
    if (updated > 0) per_param.push_back(median(seconds) / updated);
  }
  c.adamw_s_per_param = per_param.empty() ? 0 : median(per_param);
  return c;
}

}  // namespace pipetrain
