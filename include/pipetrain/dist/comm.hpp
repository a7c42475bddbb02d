// All communication goes through Comm: it is the only code that calls MPI. It owns the world,
// pipeline (the P stages of one replica), data (the D replicas of one stage) and tied-embedding
// (first + last stage of one replica) communicators, and every wait: nonblocking calls completed by
// polling MPI_Test, yielding the core when ranks outnumber cores (MPICH's blocking calls spin), and
// giving up after comm.timeout_s with an error that names what was awaited.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "pipetrain/dist/topology.hpp"
#include "pipetrain/util/errors.hpp"

namespace pipetrain {

// A wait exceeded comm.timeout_s (a stuck or dead peer): a fault, not bad input.
struct CommTimeout : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class WaitMode { spin, yield };

// What a wait is for, so a timeout can say which stage, peer, node and micro-batch it was stuck on.
enum class Group { none, data, tied, world };  // the communicator of a collective
struct WaitLabel {
  const char* what;     // "recv activation", "send gradient", "all-reduce gradients", ...
  int peer_stage = -1;  // a pipeline peer of the same replica; -1: none
  int micro_batch = -1;
  Group group = Group::none;  // a collective: its members are named on timeout
  int peer_rank = -1;         // a peer by world rank (smoke test)
};

class Comm {
 public:
  // MPI_Init / MPI_Finalize. init() is idempotent and returns the world size.
  static int init(int* argc, char*** argv);
  // Ends MPI after a finished run. MPICH 4.0 over UCX/TCP hangs in MPI_Finalize with 3+ ranks on
  // different nodes: a rank closing its endpoints waits for a peer that already sits in the PMI
  // barrier. So across nodes (comm.finalize = "auto") or always ("skip") the ranks meet in a
  // barrier and exit without MPI_Finalize; otherwise ("mpi") MPI_Finalize runs under a watchdog.
  // Either wait is bounded by comm.finalize_timeout_s (0 = forever); output is flushed first and
  // the process exits with `exit_code` either way, saying so if it had to give up waiting.
  static void finalize(int exit_code);
  static void set_finalize(FinalizePolicy how, double timeout_s);
  // Agreements of all ranks (run_agreed, require_agreed) time out after `seconds` from now on,
  // naming `what` they were for; start-up allows kStartupAgreementS.
  static void bound_agreements(double seconds, const char* what);
  static constexpr double kStartupAgreementS = 600;
  static int world_rank();
  static int world_size();
  [[noreturn]] static void abort(int code);

  // Agree across the world whether a start-up step failed: `code` is this rank's exit code (0 =
  // fine). Returns the lowest failing rank (-1 if none) and the highest code, so every rank exits
  // together instead of some hanging in a later collective.
  struct Failure {
    int rank, code;
  };
  static Failure first_failure(int code);
  // Largest message tag this MPI accepts (MPI_TAG_UB, at least 32767).
  static int max_tag();
  // Runs `step` on every rank and agrees on the outcome: if any rank threw, the lowest failing
  // rank prints its message once and every rank gets the same exit code (2 for SpecError, 1 for
  // any other exception); 0 when all succeeded. Also a barrier.
  static int run_agreed(const std::function<void()>& step);
  // The same, throwing AgreedExit{code} on failure.
  static void require_agreed(const std::function<void()>& step);

  // Builds the grid communicators.
  Comm(const Topology& topo, WaitPolicy wait, double timeout_s);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  const Topology& topo() const { return topo_; }
  WaitMode wait_mode() const { return mode_; }
  int local_ranks() const;  // ranks on this rank's node
  int local_rank() const;   // this rank's index among them
  // Host name of every world rank, learnt at construction (node map, timeout messages).
  const std::vector<std::string>& hosts() const;
  // Cores this rank can use without taking them from the other ranks on its node (>= 1).
  int cores_per_rank() const;

  // Pipeline p2p with the neighbouring stage of the same replica. Buffers must stay alive until
  // the request is waited on.
  MPI_Request isend(const float* buf, size_t n, int peer_stage, int tag);
  MPI_Request irecv(float* buf, size_t n, int peer_stage, int tag);
  // Waits, adding the time spent to wait_seconds(). Throws CommTimeout.
  void wait(MPI_Request& req, const WaitLabel& label);
  void wait_all(std::vector<MPI_Request>& reqs, const WaitLabel& label);

  // In-place sums. data: over the D replicas of this stage; world: over all ranks;
  // tied: between first and last stage (no-op when P = 1).
  MPI_Request iallreduce_data(float* buf, size_t n);
  void allreduce_data(double* buf, size_t n);
  void allreduce_world(double* buf, size_t n);
  void allreduce_tied(float* buf, size_t n);

  // Gathers `n` values from every rank to world rank 0 (out sized world*n there).
  void gather_to_root(const double* mine, size_t n, std::vector<double>& out);
  void gather_to_root(const uint64_t* mine, size_t n, std::vector<uint64_t>& out);
  // Gathers one string of any length from every rank to world rank 0 (out has world entries there).
  void gather_to_root(const std::string& mine, std::vector<std::string>& out);
  // The data-parallel communicator, for parallel HDF5's MPI-IO driver (which makes its own MPI
  // calls on it); nothing else should use the raw handle.
  MPI_Comm data_handle() const { return data_; }
  // Smoke test: `reps` round trips of n bytes with world rank `peer` (this rank starts when
  // `initiator`); returns seconds per round trip. A barrier lets the other ranks wait politely.
  double ping_pong(int peer, bool initiator, std::vector<char>& buf, int reps);
  void barrier();

  // Checks every rank holds the same value (e.g. spec hash); returns false otherwise.
  bool all_equal(uint64_t value);
  // Start-up handshake: each stage sends the description of the activation it will send (shape,
  // element size) to the next stage, which compares it with what it expects to receive. Returns
  // false on this rank if the previous stage announced something else, so a mismatch is an error
  // at start-up rather than a hang or garbage mid-run.
  bool boundary_agrees(const std::vector<int64_t>& send_desc, const std::vector<int64_t>& recv_desc);

  // Seconds this rank has spent inside waits since the last reset.
  double wait_seconds() const { return wait_s_; }
  void reset_wait_seconds() { wait_s_ = 0; }

 private:
  void poll(MPI_Request& req, const WaitLabel& label);
  std::string where(int world_rank) const;  // "rank 3 on node2"
  Topology topo_;
  MPI_Comm pipe_ = MPI_COMM_NULL, data_ = MPI_COMM_NULL, tied_ = MPI_COMM_NULL;
  WaitMode mode_ = WaitMode::spin;
  double timeout_s_;
  double wait_s_ = 0;
};

}  // namespace pipetrain
