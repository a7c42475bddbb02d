#include "pipetrain/tools/smoke.hpp"
#include "pipetrain/tools/cli.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "pipetrain/ckpt/shard_io.hpp"
#include "pipetrain/compute/bf16_products.hpp"
#include "pipetrain/compute/blas.hpp"
#include "pipetrain/compute/blas_kernels.hpp"
#include "pipetrain/compute/cpu_features.hpp"
#include "pipetrain/compute/device.hpp"
#include "pipetrain/config/spec.hpp"
#include "pipetrain/dist/comm.hpp"
#include "pipetrain/dist/launch.hpp"
#include "pipetrain/dist/topology.hpp"
#include "pipetrain/model/layer_decl.hpp"
#include "pipetrain/model/optimizer_shard.hpp"
#include "pipetrain/tools/node_load.hpp"
#include "pipetrain/train/train.hpp"
#include "pipetrain/util/clock.hpp"
#include "pipetrain/util/stats.hpp"
#include "pipetrain/util/text_table.hpp"

namespace fs = std::filesystem;

namespace pipetrain {
namespace {

// Generous floors: the smoke test catches broken or badly misconfigured pieces, and links
// kSlowFactor times worse than the best of their kind (within a node / across nodes).
constexpr double kMaxLatencyS = 0.05, kMinBandwidthMiBs = 1.0, kSlowFactor = 4.0;

struct Row {
  std::string check, where, value;
  bool pass;
  bool warn = false;  // passes, but says something a user should look at
};

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// The layout to test: the spec's if it fits the ranks, else its tensor groups (when tp divides the
// ranks) with the rest as pipeline stages in pairs.
RunSpec smoke_spec(const SmokeOptions& opt, int world) {
  RunSpec spec = load_spec(opt.config, opt.overrides, 0);
  auto& p = spec.parallel;
  if (p.tp * p.pp * p.dp != world) {
    if (world % p.tp != 0) p.tp = 1;
    const int cells = world / p.tp;
    p.pp = cells % 2 == 0 ? 2 : 1;
    p.dp = cells / p.pp;
  }
  p.micro_batches = 2;
  spec.train.global_batch = 2 * p.dp * p.micro_batches;
  spec.model.n_layer = std::max(spec.model.n_layer, p.pp);
  return spec;
}

// Each stage's ranks write a shard of a 4 MiB tensor the way a save does (the stage's first rank
// creates the file, every rank, replica and tensor rank, writes its row slab of each array at the
// offsets it broadcasts), then the first rank reads it back and compares; "" or what failed.
std::string check_checkpoint_io(Comm& comm, const std::string& dir) {
  const Topology& t = comm.topo();
  std::vector<float> data(1 << 20);  // 4 MiB, a different pattern per stage
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>((i * 2654435761u + t.stage) % 1000003) * 1e-3f;
  std::string error;
  std::error_code ec;
  if (t.world_rank == 0) fs::create_directories(dir, ec);
  comm.barrier();
  const std::string path = dir + "/stage_" + std::to_string(t.stage) + ".h5";
  const RowRange rows = row_slab(1024, t.dp_rank * t.tp + t.tp_rank, t.dp * t.tp);  // this rank's rows
  std::vector<uint64_t> offsets(3, 0);  // of params, exp_avg, exp_avg_sq in the file
  if (!fs::is_directory(dir, ec)) error = "checkpoint directory " + dir + ": cannot create";
  if (error.empty() && t.leads_stage()) {
    try {
      offsets = create_shard_file(path, {{"smoke.weight", {1024, 1024}}}, 0);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  comm.broadcast_in_stage(offsets.data(), offsets.size());  // a 0 offset: the file was not made
  if (error.empty() && offsets[0] == 0) error = path + ": not created by the stage's first rank";
  if (error.empty()) {
    const float* slab = data.data() + rows.begin * 1024;
    std::vector<SlabBytes> slabs;
    for (uint64_t at : offsets)
      slabs.push_back({at + rows.begin * 1024 * sizeof(float), slab, (rows.end - rows.begin) * 1024});
    error = write_slabs(path, slabs, 0);
  }
  comm.barrier();  // every slab written before the read-back
  if (error.empty() && t.leads_stage()) {
    try {
      std::vector<float> back(data.size());
      ShardReader(path).read("params", "smoke.weight", {1024, 1024}, back.data());
      if (back != data) error = path + ": read back differs from what was written";
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  comm.barrier();
  if (t.world_rank == 0) fs::remove_all(dir, ec);
  return error;
}

// Where every rank runs: one row per rank.
void check_placement(Comm& comm, const LaunchInfo& launch, std::vector<Row>& rows) {
  const Topology& topo = comm.topo();
  std::vector<std::string> where;
  comm.gather_to_root(launch.host + " local " + std::to_string(launch.localid) + " stage " +
                          std::to_string(topo.stage) + " dp " + std::to_string(topo.dp_rank) +
                          (topo.tp > 1 ? " tp " + std::to_string(topo.tp_rank) : ""),
                      where);
  for (int r = 0; r < static_cast<int>(where.size()); ++r)
    rows.push_back({"rank", "rank " + std::to_string(r), where[r], true});
}

// Every pipeline link (each tensor rank's own), one at a time: latency of 8 B and bandwidth of
// 4 MiB round trips. The latency is the best of 5 rounds of 40: a round that the scheduler
// interrupted (more ranks than cores, a daemon waking) says nothing of the link, and a slow link is
// slow in every round.
void check_links(Comm& comm, std::vector<Row>& rows) {
  const Topology& topo = comm.topo();
  const int rank = topo.world_rank;
  struct Link {
    std::string where;
    double latency_s, mib_per_s;
    bool crosses_nodes;
  };
  std::vector<Link> links;
  for (int k = 0; k < topo.tp; ++k)
    for (int d = 0; d < topo.dp; ++d)
      for (int s = 0; s + 1 < topo.pp; ++s) {
        const int a = topo.rank_of(s, d, k), b = topo.rank_of(s + 1, d, k);
        double lat = 0, bw = 0;
        if (rank == a || rank == b) {
          std::vector<char> small(8), big(4 << 20);
          comm.ping_pong(rank == a ? b : a, rank == a, small, 20);  // warm-up
          lat = 1e30;
          for (int round = 0; round < 5; ++round)
            lat = std::min(lat, comm.ping_pong(rank == a ? b : a, rank == a, small, 40) / 2);
          bw = 2.0 * big.size() / comm.ping_pong(rank == a ? b : a, rank == a, big, 5) / (1 << 20);
        }
        double figures[2] = {rank == a ? lat : 0, rank == a ? bw : 0};
        comm.allreduce_world(figures, 2);  // rank 0 learns them; also keeps the links one at a time
        const auto& host = comm.world().hosts();
        const bool crosses = host[a] != host[b];
        links.push_back({"stage " + std::to_string(s) + "->" + std::to_string(s + 1) + " dp " + std::to_string(d) +
                             (topo.tp > 1 ? " tp " + std::to_string(k) : "") + " (" + host[a] +
                             (crosses ? "->" + host[b] : "") + ", ranks " + std::to_string(a) + "->" +
                             std::to_string(b) + ")",
                         figures[0], figures[1], crosses});
      }
  // A link is slow when it is far behind the best link of its kind (within a node or across
  // nodes): one bad cable or NIC shows up even when it still beats the absolute floors.
  for (const Link& l : links) {
    double best_lat = 1e30, best_bw = 0;
    for (const Link& o : links)
      if (o.crosses_nodes == l.crosses_nodes) {
        best_lat = std::min(best_lat, o.latency_s);
        best_bw = std::max(best_bw, o.mib_per_s);
      }
    const bool lat_ok = l.latency_s <= kMaxLatencyS && l.latency_s <= kSlowFactor * best_lat + 1e-4;
    const bool bw_ok = l.mib_per_s >= kMinBandwidthMiBs && l.mib_per_s * kSlowFactor >= best_bw;
    rows.push_back({"p2p latency", l.where,
                    fmt("%.1f us", l.latency_s * 1e6) + (lat_ok ? "" : fmt(" (best %.1f us)", best_lat * 1e6)),
                    lat_ok});
    rows.push_back({"p2p bandwidth", l.where,
                    fmt("%.0f MiB/s", l.mib_per_s) + (bw_ok ? "" : fmt(" (best %.0f MiB/s)", best_bw)), bw_ok});
  }
}

// Every tensor group's all-reduce, all groups at once as inside training's layers: the sum right,
// and its bandwidth not far below the best group's. Its size is the one the spec's blocks sum
// (layer_decl.hpp: a micro-batch's activation rows), at least 4 MiB so that bandwidth, not
// latency, is measured.
void check_tensor_all_reduce(Comm& comm, const RunSpec& spec, std::vector<Row>& rows) {
  const Topology& topo = comm.topo();
  if (topo.tp == 1) return;
  const MessageCount sums =
      chunk_messages(spec, {0, 1}, false, false, ChunkPass::forward)[static_cast<int>(Exchange::sum)];
  const size_t declared = static_cast<size_t>(sums.bytes / std::max(1.0, sums.calls));
  std::vector<float> buf(std::max<size_t>(declared, 4 << 20) / sizeof(float), 1.0f);
  comm.allreduce_tensor(buf.data(), buf.size());  // warm-up
  std::fill(buf.begin(), buf.end(), 1.0f);
  const double t0 = now_s();
  for (int i = 0; i < 3; ++i) comm.allreduce_tensor(buf.data(), buf.size());
  const double bw = 3.0 * buf.size() * sizeof(float) / (now_s() - t0) / (1 << 20);
  const bool right = buf[0] == std::pow(static_cast<float>(topo.tp), 3.0f);
  std::vector<double> per_rank;
  const double mine[1] = {right ? bw : -bw};
  comm.gather_to_root(mine, 1, per_rank);
  if (topo.world_rank != 0) return;
  double best = 0;
  for (double v : per_rank) best = std::max(best, v);
  for (int s = 0; s < topo.pp; ++s)
    for (int d = 0; d < topo.dp; ++d) {
      const double v = per_rank[topo.rank_of(s, d, 0)];
      const bool ok = v >= kMinBandwidthMiBs && v * kSlowFactor >= best;
      const auto& host = comm.world().hosts();
      const bool spans = host[topo.rank_of(s, d, 0)] != host[topo.rank_of(s, d, topo.tp - 1)];
      rows.push_back(
          {"tensor all-reduce",
           "tensor group of stage " + std::to_string(s) + " dp " + std::to_string(d) + (spans ? " (spans nodes)" : ""),
           v < 0 ? "wrong sum"
                 : fmt("%.0f MiB/s", v) + fmt(" over %.1f MiB", buf.size() * sizeof(float) / 1048576.0) +
                       (ok ? "" : fmt(" (best %.0f MiB/s)", best)),
           v >= 0 && ok, spans});
    }
}

// Every data group's all-reduce, all groups at once as in training.
void check_all_reduce(Comm& comm, std::vector<Row>& rows) {
  const Topology& topo = comm.topo();
  const int rank = topo.world_rank;
  if (topo.dp > 1) {
    std::vector<float> buf(4 << 20, 1.0f);  // 16 MiB
    const double t0 = now_s();
    for (int i = 0; i < 3; ++i) {
      std::vector<Request> reqs{comm.iallreduce_data(buf.data(), buf.size())};
      comm.wait_all(reqs, {"smoke-test all-reduce", -1, -1, Group::data});
    }
    const double bw = 3.0 * buf.size() * sizeof(float) / (now_s() - t0) / (1 << 20);
    const bool right = buf[0] == std::pow(static_cast<float>(topo.dp), 3.0f);
    std::vector<double> per_rank;
    const double mine[1] = {right ? bw : -bw};
    comm.gather_to_root(mine, 1, per_rank);
    for (int s = 0; s < topo.pp && rank == 0; ++s)
      for (int k = 0; k < topo.tp; ++k) {
        const double v = per_rank[topo.rank_of(s, 0, k)];
        rows.push_back({"all-reduce",
                        "data group of stage " + std::to_string(s) + (topo.tp > 1 ? " tp " + std::to_string(k) : ""),
                        v < 0 ? "wrong sum" : fmt("%.0f MiB/s", v), v >= kMinBandwidthMiBs});
      }
  }
}

// The machine this rank runs on: its kernel's boot id, the same for emulated nodes that share one.
std::string machine_id() {
  std::string id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> id;
  return id;
}

// Nodes (2+) compared by the median of their ranks' best times (`best`, by rank on `host`).
void compare_nodes(const std::vector<std::string>& nodes, const std::vector<std::string>& host,
                   const std::vector<double>& best, double ratio, std::vector<Row>& rows) {
  if (nodes.size() < 2) return;
  std::vector<double> node_s;
  for (const std::string& node : nodes) {
    std::vector<double> v;
    for (size_t r = 0; r < best.size(); ++r)
      if (host[r] == node) v.push_back(best[r]);
    node_s.push_back(median(v));
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    const double x = node_s[i] / median_without(node_s, i);
    rows.push_back({"compute", "node " + nodes[i], fmt("%.1f ms", 1e3 * node_s[i]) + fmt(", %.2fx the other nodes", x),
                    x <= ratio});
  }
}

constexpr int kTrials = 5;          // timed trials per rank
constexpr double kBusyCores = 0.5;  // CPU time outside the job that makes a node busy

// Rank 0's verdicts on check_compute's timings: `seconds` (kTrials per rank), `cpu` (per rank:
// its machine's CPU time, the job's own, the seconds they cover), `others` (what else ran).
void judge_compute(Comm& comm, const std::vector<std::string>& machines, const std::vector<double>& turn,
                   const std::vector<double>& seconds, const std::vector<double>& cpu,
                   const std::vector<std::string>& others, double reps, double ratio, std::vector<Row>& rows) {
  const int world = comm.world().size();
  const auto& host = comm.world().hosts();
  auto time_of = [&](int r, int trial) { return seconds[static_cast<size_t>(r) * kTrials + trial]; };
  std::map<std::string, double> outside_cores;  // per machine: CPU time outside the job / the check's time
  std::map<std::string, std::string> outside_who;
  for (int r = 0; r < world; ++r) {
    outside_cores[machines[r]] += (cpu[3 * r] - cpu[3 * r + 1]) / std::max(cpu[3 * r + 2], 1e-3);
    if (!others[r].empty()) outside_who[machines[r]] = others[r];
  }
  for (int r = 0; r < world; ++r)
    if (turn[r] == 0 && outside_cores[machines[r]] >= kBusyCores)
      rows.push_back({"node load", "node " + host[r],
                      fmt("busy outside the job: %.1f cores; ", outside_cores[machines[r]]) + outside_who[machines[r]],
                      true, true});
  std::vector<double> best(world);
  for (int r = 0; r < world; ++r) {
    best[r] = time_of(r, 0);
    for (int i = 1; i < kTrials; ++i) best[r] = std::min(best[r], time_of(r, i));
  }
  int slowest = 0;
  for (int r = 0; r < world; ++r) {
    if (best[r] > best[slowest]) slowest = r;
    if (world < 2) continue;
    bool slow_every_time = true;
    double worst = 0;
    for (int i = 0; i < kTrials; ++i) {
      std::vector<double> trial(world);
      for (int q = 0; q < world; ++q) trial[q] = time_of(q, i);
      slow_every_time = slow_every_time && trial[r] / median_without(trial, r) > ratio;
      worst = std::max(worst, trial[r]);
    }
    if (!slow_every_time) continue;
    const bool node_busy = outside_cores[machines[r]] >= kBusyCores;
    rows.push_back({"compute", "rank " + std::to_string(r) + " (" + host[r] + ")",
                    fmt("best %.1f ms", 1e3 * best[r]) + fmt(" (worst %.1f)", 1e3 * worst) +
                        fmt(", %.2fx the other ranks' best in every trial", best[r] / median_without(best, r)) +
                        (node_busy ? "; its node is busy outside the job (see node load)" : ""),
                    node_busy, node_busy});
  }
  rows.push_back({"compute", fmt("%.0f products of 256x256 per rank", reps) + fmt(", %.0f trials", kTrials),
                  fmt("best median %.1f ms", 1e3 * median(best)) +
                      fmt(", spread %.1f", 1e3 * *std::min_element(seconds.begin(), seconds.end())) +
                      fmt("-%.1f ms", 1e3 * *std::max_element(seconds.begin(), seconds.end())) + ", slowest rank " +
                      std::to_string(slowest),
                  true});
  compare_nodes(comm.world().nodes(), host, best, ratio, rows);
}

// Every rank times the same fixed workload (matrix products on its compute device, ~0.1 s) in
// kTrials trials; in each, the ranks of a machine take turns, so each is timed alone on its cores,
// while machines run at once. A capability is judged, not a moment's noise: a rank fails only when
// it is slower than the median of the others by `ratio` in every trial, and it is judged by its
// best. A node busy with processes outside the job (their CPU time over the check, at least half
// a core) is said to be, and a slow rank there is a warning that names them rather than a failure.
// Nodes (2+) compare by the median of their ranks' best.
void check_compute(Comm& comm, double ratio, std::vector<Row>& rows) {
  const int rank = comm.topo().world_rank, world = comm.world().size();
  std::vector<std::string> machines;
  comm.gather_to_root(machine_id(), machines);
  std::vector<double> turn(world, 0);  // rank 0 assigns: the how-manieth rank of its machine
  if (rank == 0)
    for (int r = 0; r < world; ++r) turn[r] = std::count(machines.begin(), machines.begin() + r, machines[r]);
  comm.allreduce_world(turn.data(), world);
  const int turns = static_cast<int>(*std::max_element(turn.begin(), turn.end())) + 1;

  constexpr int n = 256;
  double reps = 1;  // as many products as take rank 0 about 0.1 s
  if (rank == 0) {
    time_matrix_products(n, 1);  // warm-up
    while (time_matrix_products(n, static_cast<int>(reps)) < 0.1 && reps < (1 << 20)) reps *= 2;
  }
  comm.idle_barrier();  // the others leave rank 0 its cores meanwhile
  reps = comm.broadcast_from_root(reps);
  const NodeLoad load;
  double mine[kTrials] = {};
  for (int trial = 0; trial < kTrials; ++trial)
    for (int t = 0; t < turns; ++t) {
      comm.idle_barrier();
      if (turn[rank] != t) continue;
      if (trial == 0) time_matrix_products(n, 1);
      mine[trial] = time_matrix_products(n, static_cast<int>(reps));
    }
  comm.idle_barrier();
  // What the node did meanwhile: its CPU time (first rank of the machine) less this job's ranks'.
  const NodeLoad::Busy busy = load.finish();
  double used[3] = {turn[rank] == 0 ? busy.node_cpu_s : 0, busy.own_cpu_s, busy.seconds};
  std::vector<double> seconds, cpu;
  std::vector<std::string> others;
  comm.gather_to_root(mine, kTrials, seconds);
  comm.gather_to_root(used, 3, cpu);
  comm.gather_to_root(turn[rank] == 0 ? fmt("load %.2f", busy.load_average) +
                                            (busy.busiest_others.empty() ? "" : "; " + busy.busiest_others)
                                      : "",
                      others);
  if (rank != 0) return;
  judge_compute(comm, machines, turn, seconds, cpu, others, reps, ratio, rows);
}

// One row of `check` per finding the ranks report, naming the ranks (and hosts) that share it.
// `mine` is this rank's finding after its verdict: '-' ok, 'W' a warning, 'F' a failure.
void rows_by_finding(Comm& comm, const char* check, const std::string& mine, std::vector<Row>& rows) {
  std::vector<std::string> all;
  comm.gather_to_root(mine, all);
  if (comm.topo().world_rank != 0) return;
  const auto& host = comm.world().hosts();
  std::map<std::string, std::string> ranks_with;  // the same finding on several ranks: one row
  for (size_t r = 0; r < all.size(); ++r)
    ranks_with[all[r]] += (ranks_with[all[r]].empty() ? "" : ", ") + std::to_string(r) + " (" + host[r] + ")";
  for (const auto& [finding, ranks] : ranks_with)
    rows.push_back({check, "rank" + std::string(ranks.find(',') != std::string::npos ? "s " : " ") + ranks,
                    finding.substr(1), finding[0] != 'F', finding[0] == 'W'});
}

// Which BLAS kernels each rank computes with: a rank whose kernels run below its CPU fails, unless
// the environment chose them (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE: then a warning naming it).
void check_blas_kernels(Comm& comm, std::vector<Row>& rows) {
  const KernelDecision& d = blas_kernel_decision();
  const SimdLevel cpu = cpu_features().level;
  std::string mine = "OpenBLAS " + blas_kernel_family() + " kernels on an " + name_of(cpu) + " CPU";
  if (d.below_cpu)
    mine += std::string(", which runs ") + kernels_for(cpu) + (d.user_chose ? ": the environment's choice" : "");
  rows_by_finding(comm, "BLAS kernels", (d.below_cpu ? (d.user_chose ? "W" : "F") : "-") + mine, rows);
}

// Under model.dtype = bf16 on the CPU, what each rank's bf16 products run on: a warning where oneDNN
// emulates them (a CPU without bf16 instructions: a bf16 run there is slower than fp32), and
// ranks that differ (nodes of several CPU kinds) in rows of their own.
void check_bf16_products(Comm& comm, std::vector<Row>& rows) {
  const Bf16Products& p = bf16_products();
  rows_by_finding(comm, "bf16 products",
                  std::string(p.native ? "-" : "W") + "oneDNN " + p.kernel + " (" + p.isa + ")" +
                      (p.native ? "" : ", bf16 emulated on the fp32 units"),
                  rows);
}

// Parallel HDF5 in the checkpoint directory.
void check_checkpoint_dir(Comm& comm, const std::string& run_dir, const std::string& tag, std::vector<Row>& rows) {
  const int rank = comm.topo().world_rank;
  const std::string ckpt_dir = run_dir + "/checkpoints/.smoke_" + tag;
  std::vector<std::string> io_errors;
  comm.gather_to_root(check_checkpoint_io(comm, ckpt_dir), io_errors);
  for (int r = 0; r < static_cast<int>(io_errors.size()); ++r)
    if (!io_errors[r].empty()) rows.push_back({"checkpoint I/O", "rank " + std::to_string(r), io_errors[r], false});
  if (rank == 0 && std::all_of(io_errors.begin(), io_errors.end(), [](auto& e) { return e.empty(); }))
    rows.push_back(
        {"checkpoint I/O", run_dir + "/checkpoints", "HDF5 shard written as saves do, read back equal", true});
}

// A 3-step tiny training run on this layout must lower the loss.
void check_training(const SmokeOptions& opt, const RunSpec& spec, World& w, const std::string& run_dir,
                    const std::string& tag, std::vector<Row>& rows) {
  const int rank = w.rank();
  TrainOptions train;
  train.config = opt.config;
  train.overrides = opt.overrides;
  for (const char* s :
       {"run.steps=3", "checkpoint.every_steps=0", "log.every_steps=1", "log.trace_steps=0", "train.warmup_steps=1"})
    train.overrides.push_back(s);
  const auto& p = spec.parallel;
  for (const std::string& s :
       std::vector<std::string>{"parallel.tp=" + std::to_string(p.tp), "parallel.pp=" + std::to_string(p.pp),
                                "parallel.dp=" + std::to_string(p.dp), "parallel.micro_batches=2",
                                "train.global_batch=" + std::to_string(spec.train.global_batch),
                                "model.n_layer=" + std::to_string(spec.model.n_layer)})
    train.overrides.push_back(s);
  train.run_dir = run_dir + "/.smoke_train_" + tag;
  train.resume = ResumeFrom(ResumeMode::never);
  ExitCode train_code = ExitCode::ok;
  try {
    train_code = run_train(train, w);
  } catch (const AgreedExit& e) {
    train_code = e.code;
  }
  if (rank == 0) {
    std::vector<double> losses;
    std::ifstream in(train.run_dir + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);) losses.push_back(nlohmann::json::parse(line).value("loss", NAN));
    const bool falls =
        train_code == ExitCode::ok && losses.size() == 3 && std::isfinite(losses[2]) && losses[2] < losses[0];
    rows.push_back({"training", "3 steps, " + grid_text(p.tp, p.pp, p.dp),
                    losses.size() == 3 ? fmt("loss %.3f", losses[0]) + fmt(" -> %.3f", losses[2])
                                       : "exit " + std::to_string(static_cast<int>(train_code)),
                    falls});
    std::error_code ec;
    fs::remove_all(train.run_dir, ec);
  }
}

}  // namespace

ExitCode run_smoke(const SmokeOptions& opt, World& w) {
  const int world = w.size(), rank = w.rank();
  RunSpec spec;
  if (ExitCode code = w.run_agreed([&] {
        spec = smoke_spec(opt, world);
        use_spec_device(spec, w.local_rank(),
                        w.local_ranks());  // the compute check times the device training would use
      });
      code != ExitCode::ok)
    return code;
  w.set_finalize(spec.comm.finalize, spec.comm.finalize_timeout_s);
  const Topology topo =
      Topology::of(rank, spec.parallel.pp, spec.parallel.dp, spec.parallel.order, false, spec.parallel.tp);
  Comm comm(w, topo, spec.comm.wait, std::min(spec.comm.timeout_s, 30.0));  // a smoke test answers fast
  const std::string run_dir = opt.run_dir.empty() ? spec.run.out_dir + "/smoke" : opt.run_dir;
  // One name for this test's scratch directories on every rank: rank 0's pid.
  double pid = rank == 0 ? getpid() : 0;
  comm.allreduce_world(&pid, 1);
  const std::string tag = std::to_string(static_cast<long>(pid));
  std::vector<Row> rows;
  const LaunchInfo launch = LaunchInfo::from_environment();

  check_placement(comm, launch, rows);
  check_blas_kernels(comm, rows);
  if (spec.model.dtype == Dtype::bf16 && spec.run.device == Device::cpu) check_bf16_products(comm, rows);
  if (spec.log.straggler_ratio > 0) check_compute(comm, spec.log.straggler_ratio, rows);
  check_links(comm, rows);
  check_all_reduce(comm, rows);
  check_tensor_all_reduce(comm, spec, rows);
  check_checkpoint_dir(comm, run_dir, tag, rows);
  check_training(opt, spec, w, run_dir, tag, rows);

  // Verdict: rank 0 knows every row; all ranks exit alike.
  double failures = 0;
  if (rank == 0) {
    std::printf("\npipetrain smoke: %d ranks, %s, %s\n", world, grid_text(topo.tp, topo.pp, topo.dp).c_str(),
                launch.describe().c_str());
    std::vector<std::vector<std::string>> table = {{"check", "where", "value", "result"}};
    for (auto& r : rows) {
      table.push_back({r.check, r.where, r.value, !r.pass ? "FAIL" : r.warn ? "warn" : "ok"});
      failures += r.pass ? 0 : 1;
    }
    std::fputs(text_table(table).c_str(), stdout);
  }
  comm.allreduce_world(&failures, 1);
  if (rank == 0) {
    if (failures == 0) std::printf("PASS\n");
    else {
      std::printf("FAIL:");
      for (auto& r : rows)
        if (!r.pass) std::printf(" %s at %s (%s);", r.check.c_str(), r.where.c_str(), r.value.c_str());
      std::printf("\n");
    }
    std::fflush(stdout);
  }
  return failures == 0 ? ExitCode::ok : ExitCode::fault;
}

ExitCode smoke_command(const std::vector<std::string>& args) {
  SmokeOptions opt;
  po::options_description desc("pipetrain smoke [options]   (launch like a job: srun --mpi=pmi2 / mpiexec)");
  desc.add_options()("help,h", "show this help")("config", po::value<std::string>(&opt.config), "run spec (TOML)")(
      "set", po::value<std::vector<std::string>>(&opt.overrides)->composing(), "override one key (repeatable)")(
      "run-dir", po::value<std::string>(&opt.run_dir),
      "where checkpoint I/O and training are tried (default run.out_dir/smoke)");
  po::variables_map vm;
  if (auto done = parse_command_line("smoke", desc, args, vm)) return *done;
  return run_mpi([&](World& world) { return run_smoke(opt, world); });
}

}  // namespace pipetrain
