// Chrome/Perfetto trace of the first log.trace_steps steps of a launch: every rank records spans
// (forward/backward/recompute of each micro-batch, waits for peers, all-reduces, optimizer,
// checkpoint) in memory; rank 0 gathers them once and writes RUN_DIR/trace.json, one track per
// rank: pid = stage, tid = dp rank (x tp + tensor rank); and with replicas a second track per rank
// for its data-parallel exchanges in flight (category kDataExchange: reduce-scatters, all-reduces,
// ZeRO's all-gathers, from posting to completion); under expert parallelism a third for its
// all-to-alls (category kExpertExchange). Times are relative to one instant of world rank 0's
// clock, so the ranks' spans share one time base.
#pragma once
#include <string>
#include <vector>

#include "pipetrain/dist/comm.hpp"
#include "pipetrain/dist/topology.hpp"
#include "pipetrain/util/clock.hpp"

namespace pipetrain {

class Trace {
 public:
  static constexpr const char* kDataExchange = "dp_comm";    // spans on the rank's exchange track
  static constexpr const char* kExpertExchange = "ep_comm";  // on its all-to-all track

  Trace() = default;
  Trace(int steps, double t_ref) : steps_(steps), t_ref_(t_ref) {}

  // The step (0-based, counted from this launch) whose spans are recorded next.
  void set_step(int step, int launch_step) {
    step_ = step;
    recording_ = launch_step < steps_;
  }
  // t0, t1: now_s() values. mb < 0: not tied to a micro-batch.
  void span(const std::string& name, const char* category, double t0, double t1, int mb = -1);
  // A data-parallel exchange from posting (t0) to when the rank saw it complete (t1), on the
  // exchange track. Each starts no earlier than the one before ended: the track shows the
  // replicas' link busy, one exchange at a time. Counted whether or not the step is recorded.
  void exchange(const std::string& name, double t0, double t1);
  // Seconds the exchanges kept the link busy since the last call: the step's communication, of
  // which the waits for it (Comm::data_wait_seconds) are the exposed part.
  double take_exchange_s();

  // This rank's events as comma-separated Chrome trace JSON objects: process `stage`, thread
  // `thread` (dp rank x tp + tensor rank) of the stage's `threads`, its exchanges' and its
  // all-to-alls' threads after all of those.
  std::string events_json(int stage, int thread, int threads) const;
  // The exchange and all-to-all tracks' threads of the rank on thread `thread` of a stage of `threads`.
  static int exchange_thread(int thread, int threads) { return threads + thread; }
  static int expert_thread(int thread, int threads) { return 2 * threads + thread; }
  // The whole file from all ranks' events (rank 0).
  static std::string file_json(const std::vector<std::string>& rank_events, const Topology& topo);

 private:
  struct Event {
    std::string name;
    const char* category;
    double ts_us, dur_us;
    int step, mb;
  };
  int steps_ = 0;
  double t_ref_ = 0;
  int step_ = 0;
  bool recording_ = false;
  double exchange_end_ = 0;  // the exchange track's last span's end
  double exchange_s_ = 0;    // busy seconds since take_exchange_s
  std::vector<Event> events_;
};

// Back-to-back spans of one rank: each mark() records the time since the one before (or since
// the start or restart()).
class TraceLaps {
 public:
  explicit TraceLaps(Trace& trace) : trace_(trace), t_(now_s()) {}
  void mark(const char* name, const char* category) {
    const double t = now_s();
    trace_.span(name, category, t_, t);
    t_ = t;
  }
  void restart() { t_ = now_s(); }

 private:
  Trace& trace_;
  double t_;
};

// Gathers every rank's spans; rank 0 writes RUN_DIR/trace.json (collective). A trace that cannot
// be written is a warning, not worth stopping training for.
void write_trace(const Trace& trace, Comm& comm, const std::string& run_dir);

}  // namespace pipetrain
