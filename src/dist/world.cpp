#include "pipetrain/dist/world.hpp"

#include <mpi.h>

#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "mpi_handles.hpp"
#include "pipetrain/util/clock.hpp"
#include "pipetrain/util/faults.hpp"

namespace pipetrain {
// The one polling loop. Spinning on MPI_Test keeps latency lowest when every rank has a core;
// when ranks outnumber cores the spinner steals the core its peer needs to produce the data,
// so yield, and after a short while sleep briefly so the scheduler really runs someone else.
bool poll_until_done(MPI_Request& req, WaitMode mode, double timeout_s, double& waited, bool* pending) {
  // Timed from the first test: a test may itself do the work (progress of a collective, a copy).
  const double t0 = now_s();
  int done = 0;
  for (unsigned iter = 0;; ++iter) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (pending && iter == 0) *pending = !done;
    if (done) break;
    if (mode == WaitMode::idle) {
      timespec ts{0, 1000000};
      nanosleep(&ts, nullptr);
    } else if (mode == WaitMode::yield) {
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

World::World(int* argc, char*** argv) {
  // Threads besides the main one exist (BLAS, an asynchronous checkpoint's writer) but only the
  // main thread calls MPI: MPI_THREAD_FUNNELED says exactly that.
  int initialized = 0, thread_level = MPI_THREAD_SINGLE;
  MPI_Initialized(&initialized);
  if (!initialized) {
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &thread_level);
  } else {
    MPI_Query_thread(&thread_level);
  }
  threads_funneled_ = thread_level >= MPI_THREAD_FUNNELED;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  learn_node();
  fault_hooks().arm(rank_, [](const char* name) { return std::getenv(name); });

  // Every rank's host name, so a timeout can say on which node the peer it waited for runs.
  constexpr int kHostLen = 64;
  char host[kHostLen] = "?";
  gethostname(host, kHostLen - 1);
  std::vector<char> all(static_cast<size_t>(kHostLen) * size_);
  Request req;
  MPI_Iallgather(host, kHostLen, MPI_CHAR, all.data(), kHostLen, MPI_CHAR, MPI_COMM_WORLD, RequestOut(req));
  wait_agreed(req);
  for (int r = 0; r < size_; ++r) hosts_.emplace_back(&all[static_cast<size_t>(r) * kHostLen]);
}

// Under binding (mpiexec -bind-to core, srun --cpu-bind) each rank's own mask holds its share of
// the node, one core perhaps, but the node computes on all of them: its cores are the union of its
// ranks' masks, which the node's ranks OR together.
void World::learn_node() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
  MPI_Comm_size(node, &local_ranks_);
  MPI_Comm_rank(node, &local_rank_);
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) {
    const int n = std::min<int>(CPU_SETSIZE, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    for (int c = 0; c < n; ++c) CPU_SET(c, &mask);
  }
  own_cores_ = CPU_COUNT(&mask);
  Request req;
  MPI_Iallreduce(MPI_IN_PLACE, &mask, static_cast<int>(sizeof mask), MPI_BYTE, MPI_BOR, node, RequestOut(req));
  wait_agreed(req);
  node_cores_ = CPU_COUNT(&mask);
  MPI_Comm_free(&node);
}

int World::cores_per_rank() const { return std::max(1, std::min(own_cores_, node_cores_ / local_ranks_)); }

std::vector<std::string> World::nodes() const {
  std::vector<std::string> nodes;
  for (const std::string& h : hosts_)
    if (std::find(nodes.begin(), nodes.end(), h) == nodes.end()) nodes.push_back(h);
  return nodes;
}

std::string World::where(int rank) const {
  return "rank " + std::to_string(rank) + " on " + (rank < static_cast<int>(hosts_.size()) ? hosts_[rank] : "?");
}

std::string World::suspects() const {
  std::vector<std::string> nodes = hosts_;
  if (nodes.empty()) return "";
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  if (nodes.size() > 8) return "; some rank on one of " + std::to_string(nodes.size()) + " nodes is lost or stalled";
  std::string s = "; some rank on";
  for (auto& n : nodes) s += (n == nodes.front() ? " " : ", ") + n;
  return s + " is lost or stalled";
}

std::string World::broadcast_from_root(const std::string& text) {
  uint64_t size = rank_ == 0 ? text.size() : 0;
  Request req;
  MPI_Ibcast(&size, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD, RequestOut(req));
  wait_agreed(req);
  std::string out = rank_ == 0 ? text : std::string(size, '\0');
  if (size > 0) {
    MPI_Ibcast(out.data(), static_cast<int>(size), MPI_CHAR, 0, MPI_COMM_WORLD, RequestOut(req));
    wait_agreed(req);
  }
  return out;
}

int World::max_tag() const {
  int* ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
  return flag && ub ? *ub : 32767;
}

void World::bound_agreements(double seconds, const char* what) {
  agree_timeout_s_ = seconds;
  agree_phase_ = what;
}

World::LongerAgreements::LongerAgreements(World& world, double seconds, const char* what)
    : world_(world), seconds_(world.agree_timeout_s_), what_(world.agree_phase_) {
  world.bound_agreements(seconds, what);
}

World::LongerAgreements::~LongerAgreements() { world_.bound_agreements(seconds_, what_); }

void World::wait_agreed(Request& req) {
  double waited = 0;
  if (!poll_until_done(req, WaitMode::yield, agree_timeout_s_, waited)) {
    char bound[32];
    std::snprintf(bound, sizeof bound, "%g s", agree_timeout_s_);
    throw CommTimeout(std::string("an agreement of all ranks (") + agree_phase_ + ") did not complete within " + bound +
                      suspects());
  }
}

World::Failure World::first_failure(ExitCode code) {
  // MIN of both: the lowest failing rank, and the highest code (the most severe: bad input over fault)
  int v[2] = {code != ExitCode::ok ? rank_ : INT_MAX, -static_cast<int>(code)};
  Request req;
  MPI_Iallreduce(MPI_IN_PLACE, v, 2, MPI_INT, MPI_MIN, MPI_COMM_WORLD, RequestOut(req));
  wait_agreed(req);
  return v[0] == INT_MAX ? Failure{-1, ExitCode::ok} : Failure{v[0], static_cast<ExitCode>(-v[1])};
}

ExitCode World::run_agreed(const std::function<void()>& step) {
  std::string message;
  ExitCode code = ExitCode::ok;
  try {
    step();
  } catch (const SpecError& e) {
    message = e.what();
    code = ExitCode::bad_input;
  } catch (const std::exception& e) {
    message = e.what();
    code = ExitCode::fault;
  }
  const Failure f = first_failure(code);
  if (f.rank == rank_) report(code, message);
  return f.code;
}

void World::require_agreed(const std::function<void()>& step) {
  if (const ExitCode code = run_agreed(step); code != ExitCode::ok) throw AgreedExit(code);
}

void World::set_finalize(FinalizePolicy how, double timeout_s) {
  finalize_ = how;
  finalize_timeout_s_ = timeout_s;
}

void World::finalize(ExitCode code) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  std::fflush(stdout);
  std::fflush(stderr);  // everything said and saved before it can hang
  const int exit_code = static_cast<int>(code);
  if (finalize_ == FinalizePolicy::skip || (finalize_ == FinalizePolicy::automatic && local_ranks_ < size_)) {
    // Every rank is past its last MPI call once the barrier completes, so leaving without
    // MPI_Finalize loses nothing; it avoids the endpoint-close handshake that hangs.
    MPI_Request req;
    MPI_Ibarrier(MPI_COMM_WORLD, &req);
    double waited = 0;
    const double timeout = finalize_timeout_s_ > 0 ? finalize_timeout_s_ : 1e9;
    if (!poll_until_done(req, WaitMode::yield, timeout, waited))
      std::fprintf(stderr,
                   "pipetrain: rank %d: the closing barrier did not complete within comm.finalize_timeout_s = %g s; "
                   "exiting with %d (everything was saved before)\n",
                   rank_, timeout, exit_code);
    std::fflush(stderr);
    std::_Exit(exit_code);
  }
  if (finalize_timeout_s_ > 0) {
    const double timeout = finalize_timeout_s_;
    const int rank = rank_;
    std::thread([timeout, rank, exit_code] {
      std::this_thread::sleep_for(std::chrono::duration<double>(timeout));
      std::fprintf(stderr,
                   "pipetrain: rank %d: MPI_Finalize did not return within comm.finalize_timeout_s = %g s; "
                   "exiting with %d (everything was saved before)\n",
                   rank, timeout, exit_code);
      std::fflush(stderr);
      std::_Exit(exit_code);
    }).detach();
  }
  fault_hooks().reach(FaultPoint::hang_in_finalize);  // test-only: as the MPICH/UCX hang would
  MPI_Finalize();
}

void World::abort(ExitCode code) {
  // MPI_Abort kills the job at once; give the launcher's I/O forwarding a moment to deliver the
  // message this rank just printed, or the user sees a bare "Abort(1)".
  std::fflush(stdout);
  std::fflush(stderr);
  timespec ts{0, 300000000};
  nanosleep(&ts, nullptr);
  MPI_Abort(MPI_COMM_WORLD, static_cast<int>(code));
  std::_Exit(static_cast<int>(code));
}

}  // namespace pipetrain
