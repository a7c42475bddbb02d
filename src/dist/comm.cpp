#include "pipetrain/dist/comm.hpp"

#include "pipetrain/util/clock.hpp"
#include "pipetrain/util/faults.hpp"

#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <thread>

namespace pipetrain {
namespace {

int cores_available() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

// The one polling loop. Spinning on MPI_Test keeps latency lowest when every rank has a core;
// when ranks outnumber cores the spinner steals the core its peer needs to produce the data,
// so yield, and after a short while sleep briefly so the scheduler really runs someone else.
bool poll_until_done(MPI_Request& req, WaitMode mode, double timeout_s, double& waited) {
  int done = 0;
  MPI_Test(&req, &done, MPI_STATUS_IGNORE);
  if (done) return true;
  const double t0 = now_s();
  for (unsigned iter = 1;; ++iter) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) break;
    if (mode == WaitMode::yield) {
      if (iter < 64) {
        sched_yield();
      } else {
        timespec ts{0, 20000};
        nanosleep(&ts, nullptr);
      }
    }
    if ((iter & 255) == 0 && now_s() - t0 > timeout_s) {
      waited += now_s() - t0;
      return false;
    }
  }
  waited += now_s() - t0;
  return true;
}

// Agreements between all ranks (start-up steps, checkpoint saves) poll politely, bounded by what
// the phase allows (Comm::bound_agreements): start-up may keep a rank busy for long.
double g_agree_timeout_s = Comm::kStartupAgreementS;
const char* g_agree_phase = "start-up";
std::vector<std::string> g_world_hosts;  // every rank's host, once a Comm has learnt them

// "; some rank on node1, node2 is lost or stalled" for a wait on all ranks.
std::string suspects_of_world() {
  if (g_world_hosts.empty()) return "";
  std::vector<std::string> nodes = g_world_hosts;
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  if (nodes.size() > 8) return "; some rank on one of " + std::to_string(nodes.size()) + " nodes is lost or stalled";
  std::string s = "; some rank on";
  for (auto& n : nodes) s += (n == nodes.front() ? " " : ", ") + n;
  return s + " is lost or stalled";
}

void wait_agreed(MPI_Request& req) {
  double waited = 0;
  if (!poll_until_done(req, WaitMode::yield, g_agree_timeout_s, waited))
    throw CommTimeout(std::string("an agreement of all ranks (") + g_agree_phase + ") did not complete within " +
                      seconds(g_agree_timeout_s) + suspects_of_world());
}

double g_finalize_timeout_s = 30;
FinalizePolicy g_finalize = FinalizePolicy::automatic;
int g_local_ranks = 1, g_local_rank = 0;  // ranks on this node, and this one's index among them
}  // namespace

int Comm::init(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) MPI_Init(argc, argv);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank(), MPI_INFO_NULL, &node);
  MPI_Comm_size(node, &g_local_ranks);
  MPI_Comm_rank(node, &g_local_rank);
  MPI_Comm_free(&node);
  return world_size();
}

void Comm::bound_agreements(double seconds, const char* what) {
  g_agree_timeout_s = seconds;
  g_agree_phase = what;
}

void Comm::set_finalize(FinalizePolicy how, double timeout_s) {
  g_finalize = how;
  g_finalize_timeout_s = timeout_s;
}

void Comm::finalize(int exit_code) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  std::fflush(stdout), std::fflush(stderr);  // everything said and saved before it can hang
  if (g_finalize == FinalizePolicy::skip || (g_finalize == FinalizePolicy::automatic && g_local_ranks < world_size())) {
    // Every rank is past its last MPI call once the barrier completes, so leaving without
    // MPI_Finalize loses nothing; it avoids the endpoint-close handshake that hangs.
    MPI_Request req;
    MPI_Ibarrier(MPI_COMM_WORLD, &req);
    double waited = 0;
    const double timeout = g_finalize_timeout_s > 0 ? g_finalize_timeout_s : 1e9;
    if (!poll_until_done(req, WaitMode::yield, timeout, waited))
      std::fprintf(stderr, "pipetrain: rank %d: the closing barrier did not complete within comm.finalize_timeout_s = %g s; "
                           "exiting with %d (everything was saved before)\n", world_rank(), timeout, exit_code);
    std::fflush(stderr);
    std::_Exit(exit_code);
  }
  if (g_finalize_timeout_s > 0) {
    const double timeout = g_finalize_timeout_s;
    const int rank = world_rank();
    std::thread([timeout, rank, exit_code] {
      std::this_thread::sleep_for(std::chrono::duration<double>(timeout));
      std::fprintf(stderr, "pipetrain: rank %d: MPI_Finalize did not return within comm.finalize_timeout_s = %g s; "
                           "exiting with %d (everything was saved before)\n", rank, timeout, exit_code);
      std::fflush(stderr);
      std::_Exit(exit_code);
    }).detach();
  }
  if (test_hang_in_finalize(world_rank()))  // test-only: as the MPICH/UCX hang would
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  MPI_Finalize();
}

int Comm::world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int Comm::world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

void Comm::abort(int code) {
  // MPI_Abort kills the job at once; give the launcher's I/O forwarding a moment to deliver the
  // message this rank just printed, or the user sees a bare "Abort(1)".
  std::fflush(stdout);
  std::fflush(stderr);
  timespec ts{0, 300000000};
  nanosleep(&ts, nullptr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

Comm::Failure Comm::first_failure(int code) {
  int v[2] = {code != 0 ? world_rank() : INT_MAX, -code};  // MIN of both: lowest rank, highest code
  MPI_Request req;
  MPI_Iallreduce(MPI_IN_PLACE, v, 2, MPI_INT, MPI_MIN, MPI_COMM_WORLD, &req);
  wait_agreed(req);
  return v[0] == INT_MAX ? Failure{-1, 0} : Failure{v[0], -v[1]};
}

int Comm::run_agreed(const std::function<void()>& step) {
  std::string message;
  int code = 0;
  try {
    step();
  } catch (const SpecError& e) {
    message = e.what(), code = 2;
  } catch (const std::exception& e) {
    message = e.what(), code = 1;
  }
  const Failure f = first_failure(code);
  if (f.rank == world_rank()) std::fprintf(stderr, "pipetrain: %s: %s\n", code == 2 ? "error" : "fault", message.c_str());
  return f.rank >= 0 ? f.code : 0;
}

void Comm::require_agreed(const std::function<void()>& step) {
  if (int code = run_agreed(step)) throw AgreedExit(static_cast<ExitCode>(code));
}

int Comm::max_tag() {
  int* ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
  return flag && ub ? *ub : 32767;
}

Comm::Comm(const Topology& topo, WaitPolicy wait, double timeout_s) : topo_(topo), timeout_s_(timeout_s) {
  MPI_Comm_split(MPI_COMM_WORLD, topo.dp_rank, topo.stage, &pipe_);
  MPI_Comm_split(MPI_COMM_WORLD, topo.stage, topo.dp_rank, &data_);
  bool tied_member = topo.pp > 1 && (topo.first_stage() || topo.last_stage());
  MPI_Comm_split(MPI_COMM_WORLD, tied_member ? topo.dp_rank : MPI_UNDEFINED, topo.stage, &tied_);

  // Every rank's host name, so a timeout can say on which node the peer it waited for runs.
  constexpr int kHostLen = 64;
  char host[kHostLen] = "?";
  gethostname(host, kHostLen - 1);
  std::vector<char> all(static_cast<size_t>(kHostLen) * world_size());
  MPI_Request req;
  MPI_Iallgather(host, kHostLen, MPI_CHAR, all.data(), kHostLen, MPI_CHAR, MPI_COMM_WORLD, &req);
  wait_agreed(req);
  g_world_hosts.clear();
  for (int r = 0; r < world_size(); ++r) g_world_hosts.emplace_back(&all[static_cast<size_t>(r) * kHostLen]);

  if (wait == WaitPolicy::spin) mode_ = WaitMode::spin;
  else if (wait == WaitPolicy::yield) mode_ = WaitMode::yield;
  else mode_ = g_local_ranks > cores_available() ? WaitMode::yield : WaitMode::spin;
}

Comm::~Comm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Comm* c : {&pipe_, &data_, &tied_})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

int Comm::local_ranks() const { return g_local_ranks; }
int Comm::local_rank() const { return g_local_rank; }
const std::vector<std::string>& Comm::hosts() const { return g_world_hosts; }
int Comm::cores_per_rank() const { return std::max(1, cores_available() / g_local_ranks); }

MPI_Request Comm::isend(const float* buf, size_t n, int peer_stage, int tag) {
  MPI_Request r;
  MPI_Isend(buf, static_cast<int>(n), MPI_FLOAT, peer_stage, tag, pipe_, &r);
  return r;
}

MPI_Request Comm::irecv(float* buf, size_t n, int peer_stage, int tag) {
  MPI_Request r;
  MPI_Irecv(buf, static_cast<int>(n), MPI_FLOAT, peer_stage, tag, pipe_, &r);
  return r;
}

std::string Comm::where(int world_rank) const {
  return "rank " + std::to_string(world_rank) + " on " + g_world_hosts[world_rank];
}

void Comm::poll(MPI_Request& req, const WaitLabel& label) {
  if (req == MPI_REQUEST_NULL) return;
  if (poll_until_done(req, mode_, timeout_s_, wait_s_)) return;
  std::string msg = "stage " + std::to_string(topo_.stage) + " (" + where(topo_.world_rank) + ", dp " +
                    std::to_string(topo_.dp_rank) + ") waited more than " + seconds(timeout_s_) +
                    " (comm.timeout_s) for " + label.what;
  const bool receiving = std::string(label.what).rfind("recv", 0) == 0;
  if (label.peer_stage >= 0)
    msg += std::string(receiving ? " from" : " to") + " stage " + std::to_string(label.peer_stage) + " (" +
           where(topo_.rank_of(label.peer_stage, topo_.dp_rank)) + ")";
  if (label.peer_rank >= 0) msg += " with " + where(label.peer_rank);
  if (label.micro_batch >= 0) msg += ", micro-batch " + std::to_string(label.micro_batch);
  // A collective cannot say which member is missing: name them all, with their nodes.
  std::vector<int> members;
  if (label.group == Group::data)
    for (int d = 0; d < topo_.dp; ++d) members.push_back(topo_.rank_of(topo_.stage, d));
  if (label.group == Group::tied) members = {topo_.rank_of(0, topo_.dp_rank), topo_.rank_of(topo_.pp - 1, topo_.dp_rank)};
  if (!members.empty()) {
    msg += "; one of its members is lost or stalled:";
    for (int r : members) msg += (r == members.front() ? " " : ", ") + where(r);
  }
  if (label.group == Group::world) msg += suspects_of_world();
  throw CommTimeout(msg);
}

void Comm::wait(MPI_Request& req, const WaitLabel& label) { poll(req, label); }

void Comm::wait_all(std::vector<MPI_Request>& reqs, const WaitLabel& label) {
  for (auto& r : reqs) poll(r, label);
  reqs.clear();
}

MPI_Request Comm::iallreduce_data(float* buf, size_t n) {
  MPI_Request r;
  MPI_Iallreduce(MPI_IN_PLACE, buf, static_cast<int>(n), MPI_FLOAT, MPI_SUM, data_, &r);
  return r;
}

void Comm::allreduce_data(double* buf, size_t n) {
  MPI_Request r;
  MPI_Iallreduce(MPI_IN_PLACE, buf, static_cast<int>(n), MPI_DOUBLE, MPI_SUM, data_, &r);
  poll(r, {"all-reduce over the data group", -1, -1, Group::data});
}

void Comm::allreduce_world(double* buf, size_t n) {
  MPI_Request r;
  MPI_Iallreduce(MPI_IN_PLACE, buf, static_cast<int>(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &r);
  poll(r, {"step-boundary all-reduce (gradient norm, stop signal)", -1, -1, Group::world});
}

void Comm::allreduce_tied(float* buf, size_t n) {
  if (tied_ == MPI_COMM_NULL) return;
  MPI_Request r;
  MPI_Iallreduce(MPI_IN_PLACE, buf, static_cast<int>(n), MPI_FLOAT, MPI_SUM, tied_, &r);
  poll(r, {"tied-embedding gradient sum between first and last stage", -1, -1, Group::tied});
}

void Comm::gather_to_root(const double* mine, size_t n, std::vector<double>& out) {
  out.assign(topo_.world_rank == 0 ? n * static_cast<size_t>(world_size()) : 0, 0.0);
  MPI_Request r;
  MPI_Igather(mine, static_cast<int>(n), MPI_DOUBLE, out.data(), static_cast<int>(n), MPI_DOUBLE, 0,
              MPI_COMM_WORLD, &r);
  poll(r, {"gather of step metrics to rank 0", -1, -1, Group::world});
}

void Comm::gather_to_root(const uint64_t* mine, size_t n, std::vector<uint64_t>& out) {
  out.assign(topo_.world_rank == 0 ? n * static_cast<size_t>(world_size()) : 0, 0);
  MPI_Request r;
  MPI_Igather(mine, static_cast<int>(n), MPI_UINT64_T, out.data(), static_cast<int>(n), MPI_UINT64_T, 0,
              MPI_COMM_WORLD, &r);
  poll(r, {"gather to rank 0", -1, -1, Group::world});
}

void Comm::gather_to_root(const std::string& mine, std::vector<std::string>& out) {
  const int n = world_size();
  // Each rank sends its string plus a terminator: MPICH (ch4) was seen to lose track of later
  // collectives on the communicator after an MPI_Igatherv in which every count was zero.
  const std::string padded = mine + '\0';
  int len = static_cast<int>(padded.size());
  std::vector<int> lens(topo_.world_rank == 0 ? n : 0), offsets;
  MPI_Request r;
  MPI_Igather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD, &r);
  poll(r, {"gather of trace sizes to rank 0", -1, -1, Group::world});
  std::string all;
  if (topo_.world_rank == 0) {
    int total = 0;
    for (int l : lens) offsets.push_back(total), total += l;
    all.resize(total);
  }
  MPI_Igatherv(padded.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR, 0, MPI_COMM_WORLD, &r);
  poll(r, {"gather of traces to rank 0", -1, -1, Group::world});
  out.clear();
  for (int i = 0; i < static_cast<int>(lens.size()); ++i) out.push_back(all.substr(offsets[i], lens[i] - 1));
}

double Comm::ping_pong(int peer, bool initiator, std::vector<char>& buf, int reps) {
  const int n = static_cast<int>(buf.size()), tag = 77;
  const double t0 = now_s();
  for (int i = 0; i < reps; ++i) {
    MPI_Request r;
    for (int leg = 0; leg < 2; ++leg) {
      if ((leg == 0) == initiator) MPI_Isend(buf.data(), n, MPI_CHAR, peer, tag, MPI_COMM_WORLD, &r);
      else MPI_Irecv(buf.data(), n, MPI_CHAR, peer, tag, MPI_COMM_WORLD, &r);
      poll(r, {"smoke-test ping-pong", -1, -1, Group::none, peer});
    }
  }
  return (now_s() - t0) / reps;
}

void Comm::barrier() {
  MPI_Request r;
  MPI_Ibarrier(MPI_COMM_WORLD, &r);
  poll(r, {"barrier", -1, -1, Group::world});
}

bool Comm::all_equal(uint64_t value) {
  uint64_t lo = value, hi = value;
  MPI_Request r[2];
  MPI_Iallreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD, &r[0]);
  MPI_Iallreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD, &r[1]);
  poll(r[0], {"start-up agreement"});
  poll(r[1], {"start-up agreement"});
  return lo == hi;
}

bool Comm::boundary_agrees(const std::vector<int64_t>& send_desc, const std::vector<int64_t>& recv_desc) {
  const int n = static_cast<int>(recv_desc.size());
  std::vector<int64_t> got(recv_desc.size(), -1);
  MPI_Request r[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  if (!topo_.last_stage())
    MPI_Isend(send_desc.data(), static_cast<int>(send_desc.size()), MPI_INT64_T, topo_.stage + 1, 0, pipe_, &r[0]);
  if (!topo_.first_stage()) MPI_Irecv(got.data(), n, MPI_INT64_T, topo_.stage - 1, 0, pipe_, &r[1]);
  poll(r[0], {"start-up shape handshake", topo_.stage + 1});
  poll(r[1], {"start-up shape handshake", topo_.stage - 1});
  return topo_.first_stage() || got == recv_desc;
}

}  // namespace pipetrain
