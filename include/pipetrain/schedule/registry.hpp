// Every pipeline schedule pipetrain knows, one entry each: its name (the value of
// parallel.schedule), its generator, its bubble with even stages, what it requires of the layout
// and how plan draws it. Spec validation, plan, train and report read a schedule's properties
// only from here, so a new schedule is one generator plus one entry in registry.cpp (or one
// register_schedule() call, as the tests do).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "pipetrain/schedule/actions.hpp"
#include "pipetrain/schedule/placement.hpp"

namespace pipetrain {

// The layout a schedule runs: `stages` ranks of `chunks` model chunks each (1 unless the schedule
// is chunked), `micro_batches` per step, over a model of `blocks` transformer blocks.
struct PipelineShape {
  int stages = 1, micro_batches = 1, chunks = 1, blocks = 1;
};

// Why a layout does not suit a schedule: the spec key to name and the reason. Empty key: it does.
struct LayoutProblem {
  std::string key, why;
  explicit operator bool() const { return !key.empty(); }
};

struct ScheduleKind {
  std::string name;     // parallel.schedule = name
  std::string summary;  // one phrase for the spec reference
  std::function<ActionList(int stage, const PipelineShape&)> generate;
  // The bubble when every stage's forward and backward cost the same (metrics' bubble_theory).
  std::function<double(const PipelineShape&)> bubble;
  std::string bubble_formula;    // how plan names that figure, e.g. "closed form (P-1)/(M+P-1)"
  std::string chart_caption;     // what one slot of plan's chart shows
  bool chunked = false;          // runs parallel.virtual_stages (>= 2) chunks per rank; others run 1
  int implied_chunks = 0;        // the virtual_stages it always runs (a V: 2), the default for it; 0: none
  bool splits_backward = false;  // B and W apart: W needs the activations kept (recompute = none)
  // Requirements beyond those every schedule shares (chunk count, one block per chunk).
  std::function<LayoutProblem(const PipelineShape&)> check = nullptr;
  Placement placement = Placement::loop;  // how its chunks sit on the ranks (schedule/placement.hpp)

  ChunkPlacement placement_of(const PipelineShape& s) const { return {s.stages, s.chunks, placement}; }
};

// Every registered schedule, in registration order (the built-in six first).
const std::vector<const ScheduleKind*>& all_schedules();
// The schedule of that name, or null.
const ScheduleKind* find_schedule(const std::string& name);
// The same, throwing std::invalid_argument for an unknown name.
const ScheduleKind& schedule_named(const std::string& name);
// Adds a schedule (std::invalid_argument if the name is taken) and returns the stored entry.
const ScheduleKind& register_schedule(ScheduleKind kind);

// The first problem of `shape` under `kind`: a chunk count the schedule cannot run, its own
// requirements, or more chunks than blocks. Recompute is the caller's (see splits_backward).
LayoutProblem layout_problem(const ScheduleKind& kind, const PipelineShape& shape);

}  // namespace pipetrain
