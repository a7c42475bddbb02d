#include "pipetrain/observe/trace.hpp"

#include <algorithm>
#include <cstdio>

#include "pipetrain/util/files.hpp"

namespace pipetrain {

void Trace::span(const std::string& name, const char* category, double t0, double t1, int mb) {
  if (recording_) events_.push_back({name, category, (t0 - t_ref_) * 1e6, (t1 - t0) * 1e6, step_, mb});
}

void Trace::exchange(const std::string& name, double t0, double t1) {
  t0 = std::max(t0, exchange_end_);
  t1 = exchange_end_ = std::max(t1, t0);
  exchange_s_ += t1 - t0;
  span(name, kDataExchange, t0, t1);
}

double Trace::take_exchange_s() {
  const double s = exchange_s_;
  exchange_s_ = 0;
  return s;
}

std::string Trace::events_json(int stage, int thread, int threads) const {
  auto tid = [&](const char* category) {
    return category == kDataExchange     ? exchange_thread(thread, threads)
           : category == kExpertExchange ? expert_thread(thread, threads)
                                         : thread;
  };
  std::string out;
  char buf[320];
  for (const Event& e : events_) {
    std::snprintf(buf, sizeof buf,
                  "%s{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %d, "
                  "\"tid\": %d, \"args\": {\"step\": %d, \"mb\": %d}}",
                  out.empty() ? "" : ",\n", e.name.c_str(), e.category, e.ts_us, e.dur_us, stage, tid(e.category),
                  e.step + 1, e.mb);
    out += buf;
  }
  return out;
}

std::string Trace::file_json(const std::vector<std::string>& rank_events, const Topology& topo) {
  const int pp = topo.pp, dp = topo.dp;
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  char buf[256];
  bool first = true;
  auto add = [&](const std::string& e) {
    if (e.empty()) return;
    out += (first ? "" : ",\n") + e;
    first = false;
  };
  for (int s = 0; s < pp; ++s) {
    std::snprintf(buf, sizeof buf,
                  "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"stage %d\"}}", s, s);
    add(buf);
    for (int d = 0; d < dp; ++d)
      for (int k = 0; k < topo.tp; ++k) {
        const std::string tensor_rank = topo.tp > 1 ? " tp " + std::to_string(k) : "";
        std::snprintf(buf, sizeof buf,
                      "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": "
                      "\"dp %d%s (rank %d)\"}}",
                      s, d * topo.tp + k, d, tensor_rank.c_str(), topo.rank_of(s, d, k));
        add(buf);
        if (topo.ep > 1) {
          std::snprintf(buf, sizeof buf,
                        "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": "
                        "\"dp %d%s (rank %d): expert all-to-alls\"}}",
                        s, expert_thread(d * topo.tp + k, dp * topo.tp), d, tensor_rank.c_str(), topo.rank_of(s, d, k));
          add(buf);
        }
        if (dp == 1) continue;
        std::snprintf(buf, sizeof buf,
                      "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": "
                      "\"dp %d%s (rank %d): data-parallel exchanges\"}}",
                      s, exchange_thread(d * topo.tp + k, dp * topo.tp), d, tensor_rank.c_str(), topo.rank_of(s, d, k));
        add(buf);
      }
  }
  for (const std::string& e : rank_events) add(e);
  return out + "\n]}\n";
}

void write_trace(const Trace& trace, Comm& comm, const std::string& run_dir) {
  std::vector<std::string> all;
  const Topology& t = comm.topo();
  const int thread = t.dp_rank * t.tp + t.tp_rank;
  comm.gather_to_root(trace.events_json(t.stage, thread, t.dp * t.tp), all);
  if (comm.topo().world_rank != 0) return;
  try {
    write_file_atomically(run_dir + "/trace.json", Trace::file_json(all, comm.topo()));
  } catch (const std::runtime_error& e) {  // a trace is not worth stopping training for
    std::fprintf(stderr, "pipetrain: warning: trace.json not written: %s\n", e.what());
  }
}

}  // namespace pipetrain
