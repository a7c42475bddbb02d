#include "pipetrain/schedule/registry.hpp"

#include <algorithm>
#include <deque>
#include <stdexcept>

#include "pipetrain/schedule/generators.hpp"
#include "pipetrain/schedule/simulate.hpp"
#include "pipetrain/schedule/v_schedules.hpp"

namespace pipetrain {
namespace {

double closed_form(const PipelineShape& s) {  // (P-1)/(VM+P-1), V = 1 unless chunked
  return static_cast<double>(s.stages - 1) / (static_cast<double>(s.chunks) * s.micro_batches + s.stages - 1);
}

const char* kOneSlot = "one slot per forward or backward (T_f = T_b, as in the classic GPipe diagram)";

// A V schedule's bubble with F = B = W per chunk, from its own lists: each rank has 6M chunk slots
// of work (two chunks, three passes, M micro-batches).
double v_bubble(ActionList (*generate)(int, int, int), const PipelineShape& s) {
  std::vector<ActionList> lists;
  for (int st = 0; st < s.stages; ++st) lists.push_back(generate(st, s.stages, s.micro_batches));
  const std::vector<double> one(2 * s.stages, 1.0), two(2 * s.stages, 2.0);
  return 1.0 - 6.0 * s.micro_batches / simulate(lists, one, two, one, Placement::vee).makespan;
}

// What every V schedule needs of the layout: two chunks per rank.
LayoutProblem v_chunks(const std::string& name, const PipelineShape& s) {
  if (s.chunks == 2) return {};
  return {"parallel.virtual_stages",
          "schedule = " + name + " needs virtual_stages = 2 (its two chunks per rank form the V)"};
}

std::vector<ScheduleKind> built_in() {
  std::vector<ScheduleKind> all;
  all.push_back({"gpipe", "all forwards, then all backwards; M micro-batches in flight",
                 [](int stage, const PipelineShape& s) { return gpipe_schedule(stage, s.stages, s.micro_batches); },
                 closed_form, "closed form (P-1)/(M+P-1)", kOneSlot});
  all.push_back(
      {"1f1b", "one forward, one backward; at most P - stage in flight",
       [](int stage, const PipelineShape& s) { return one_f_one_b_schedule(stage, s.stages, s.micro_batches); },
       closed_form, "closed form (P-1)/(M+P-1)", kOneSlot});
  ScheduleKind interleaved{
      "interleaved",
      "1f1b over virtual_stages chunks per rank: bubble / V; M a multiple of pp",
      [](int stage, const PipelineShape& s) {
        return interleaved_schedule(stage, s.stages, s.micro_batches, s.chunks);
      },
      closed_form,
      "closed form (P-1)/(VM+P-1)",
      "one slot per chunk's forward or backward (F3.1: micro-batch 3 through the stage's chunk 1; chunk 0 unmarked)"};
  interleaved.chunked = true;
  interleaved.check = [](const PipelineShape& s) -> LayoutProblem {
    if (s.chunks < 2)
      return {"parallel.virtual_stages", "schedule = interleaved needs virtual_stages >= 2 (with 1 it is plain 1f1b)"};
    if (s.stages < 2)
      return {"parallel.pp", "schedule = interleaved needs pp >= 2 (chunks go round the ring of stages)"};
    if (s.micro_batches % s.stages != 0)
      return {"parallel.micro_batches",
              "micro_batches = " + std::to_string(s.micro_batches) +
                  " must be a multiple of parallel.pp = " + std::to_string(s.stages) +
                  " for schedule = interleaved (micro-batches go through the chunks in groups of pp)"};
    return {};
  };
  all.push_back(interleaved);
  ScheduleKind zb{"zb-h1",
                  "1f1b with weight gradients deferred into its bubbles, min(M, P) micro-batches held until W; "
                  "needs recompute = none",
                  [](int stage, const PipelineShape& s) { return zb_h1_schedule(stage, s.stages, s.micro_batches); },
                  [](const PipelineShape& s) {  // F = B = W, the unit of its paper: 3M slots of work per stage
                    const double P = s.stages, M = s.micro_batches;  // in 3M + P - 1 slots, 2M + 2P - 1 if M < P
                    return 1.0 - 3.0 * M / (2.0 * M + P - 1.0 + std::max(M, P));
                  },
                  "closed form (P-1)/(3M+P-1) with F = B = W (M >= P; fewer: (2P-M-1)/(2M+2P-1))",
                  "one slot per forward, input-gradient (B) or weight-gradient (W) pass"};
  zb.splits_backward = true;
  all.push_back(zb);
  ScheduleKind zbv{"zb-v",
                   "two chunks per rank in a V, B and W apart: near-zero bubble at 1f1b's memory; "
                   "virtual_stages = 2, recompute = none",
                   [](int stage, const PipelineShape& s) { return zb_v_schedule(stage, s.stages, s.micro_batches); },
                   [](const PipelineShape& s) { return v_bubble(zb_v_schedule, s); },
                   "with F = B = W",
                   "one slot per chunk's forward, input-gradient (B) or weight-gradient (W) pass "
                   "(F3.1: micro-batch 3 through the stage's chunk 1, the way back up the V)"};
  zbv.chunked = true;
  zbv.implied_chunks = 2;
  zbv.splits_backward = true;
  zbv.placement = Placement::vee;
  zbv.check = [](const PipelineShape& s) { return v_chunks("zb-v", s); };
  all.push_back(zbv);
  ScheduleKind dualpipev{
      "dualpipev",
      "two chunks per rank in a V, each forward paired with the other chunk's backward; "
      "virtual_stages = 2, M >= 2 pp, recompute = none",
      [](int stage, const PipelineShape& s) { return dualpipe_v_schedule(stage, s.stages, s.micro_batches); },
      [](const PipelineShape& s) { return v_bubble(dualpipe_v_schedule, s); },
      "with F = B = W",
      zbv.chart_caption};
  dualpipev.chunked = dualpipev.splits_backward = true;
  dualpipev.implied_chunks = 2;
  dualpipev.placement = Placement::vee;
  dualpipev.check = [](const PipelineShape& s) -> LayoutProblem {
    if (LayoutProblem p = v_chunks("dualpipev", s)) return p;
    if (s.micro_batches < 2 * s.stages)
      return {"parallel.micro_batches", "schedule = dualpipev needs micro_batches >= 2 x parallel.pp = " +
                                            std::to_string(2 * s.stages) + " (every rank must reach its steady state)"};
    return {};
  };
  all.push_back(dualpipev);
  return all;
}

// A deque: registering a schedule never moves the entries specs already point to.
struct Registry {
  std::deque<ScheduleKind> kinds;
  std::vector<const ScheduleKind*> order;
  Registry() {
    for (ScheduleKind& k : built_in()) {
      kinds.push_back(std::move(k));
      order.push_back(&kinds.back());
    }
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

const std::vector<const ScheduleKind*>& all_schedules() { return registry().order; }

const ScheduleKind* find_schedule(const std::string& name) {
  for (const ScheduleKind* k : all_schedules())
    if (k->name == name) return k;
  return nullptr;
}

const ScheduleKind& schedule_named(const std::string& name) {
  if (const ScheduleKind* k = find_schedule(name)) return *k;
  throw std::invalid_argument("unknown schedule " + name);
}

const ScheduleKind& register_schedule(ScheduleKind kind) {
  if (find_schedule(kind.name)) throw std::invalid_argument("schedule " + kind.name + " is already registered");
  if (!kind.generate || !kind.bubble)
    throw std::invalid_argument("schedule " + kind.name + " needs a generator and a bubble");
  Registry& r = registry();
  r.kinds.push_back(std::move(kind));
  r.order.push_back(&r.kinds.back());
  return r.kinds.back();
}

LayoutProblem layout_problem(const ScheduleKind& kind, const PipelineShape& s) {
  if (!kind.chunked && s.chunks > 1) {
    std::string chunked;
    for (const ScheduleKind* k : all_schedules())
      if (k->chunked) chunked += (chunked.empty() ? "\"" : " or \"") + k->name + "\"";
    return {"parallel.virtual_stages", "virtual_stages = " + std::to_string(s.chunks) + " needs parallel.schedule = " +
                                           chunked + " (schedule is " + kind.name + ")"};
  }
  if (kind.check)
    if (LayoutProblem p = kind.check(s)) return p;
  const int chunks = s.stages * s.chunks;
  if (chunks > s.blocks)
    return {"parallel.pp", (s.chunks > 1 ? "pp x virtual_stages = " + std::to_string(chunks) + " chunks"
                                         : std::to_string(s.stages) + " stages") +
                               " but model.n_layer = " + std::to_string(s.blocks) + ": every " +
                               (s.chunks > 1 ? "chunk" : "stage") + " needs at least one block"};
  return {};
}

}  // namespace pipetrain
