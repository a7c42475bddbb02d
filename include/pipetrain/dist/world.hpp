// The MPI world of one pipetrain process. The command's entry point creates it once, before any
// communicator, and passes it down; it owns what is process-wide: MPI's start and end (and the
// policy for ending across nodes), where every rank runs, and how long an agreement of all ranks
// may take. Like Comm, it is part of the one module that calls MPI.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "pipetrain/config/choices.hpp"
#include "pipetrain/dist/request.hpp"
#include "pipetrain/util/errors.hpp"

namespace pipetrain {

// A wait exceeded its bound (a stuck or dead peer): a fault, not bad input.
struct CommTimeout : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class WaitMode { spin, yield, idle };  // idle: a wait known to be long tests once a millisecond

class World {
 public:
  // MPI_Init unless MPI already runs; learns this node's ranks and every rank's host name.
  World(int* argc, char*** argv);
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_ranks() const { return local_ranks_; }  // ranks on this rank's node
  int local_rank() const { return local_rank_; }    // this rank's index among them
  int cores() const {
    return node_cores_;
  }                            // cores this rank's node computes on: the union of its ranks' affinity masks
  int cores_per_rank() const;  // cores this rank can use without taking them from its node's other ranks
  const std::vector<std::string>& hosts() const { return hosts_; }  // every rank's node
  std::vector<std::string> nodes() const;                           // each node once, in rank order
  std::string where(int rank) const;                                // "rank 3 on node2"
  // "; some rank on node1, node2 is lost or stalled": who to suspect when a world-wide wait times out.
  std::string suspects() const;
  int max_tag() const;  // the largest message tag this MPI accepts (MPI_TAG_UB, at least 32767)
  // Whether MPI granted MPI_THREAD_FUNNELED (other threads may run while the main thread calls
  // MPI), which an asynchronous checkpoint's writer thread needs.
  bool threads_allowed() const { return threads_funneled_; }
  // Rank 0's `text` on every rank (the others' argument is ignored): a decision one rank makes for
  // all. Every rank must call it.
  std::string broadcast_from_root(const std::string& text);

  // Agreements of all ranks. run_agreed runs `step` on every rank and agrees on the outcome: if any
  // rank threw, the lowest failing rank prints its message once and every rank returns the same
  // code (bad_input for SpecError, fault for anything else); ok when all succeeded. It is also a
  // barrier. require_agreed throws AgreedExit instead of returning a failure.
  ExitCode run_agreed(const std::function<void()>& step);
  void require_agreed(const std::function<void()>& step);
  // The lowest rank whose `code` is not ok (-1: none) and the most severe code.
  struct Failure {
    int rank;
    ExitCode code;
  };
  Failure first_failure(ExitCode code);

  // How long an agreement may wait for the slowest rank before it names the suspects and throws
  // CommTimeout. Start-up allows kStartupAgreementS (loading data or a checkpoint may be slow);
  // training narrows it to comm.timeout_s; a save widens it for its duration (LongerAgreements).
  static constexpr double kStartupAgreementS = 600;
  void bound_agreements(double seconds, const char* what);
  double agreement_bound_s() const { return agree_timeout_s_; }
  class LongerAgreements {  // a scope in which agreements may take `seconds`; the bound before returns after
   public:
    LongerAgreements(World& world, double seconds, const char* what);
    ~LongerAgreements();
    LongerAgreements(const LongerAgreements&) = delete;
    LongerAgreements& operator=(const LongerAgreements&) = delete;

   private:
    World& world_;
    double seconds_;
    const char* what_;
  };

  // How a finished run leaves MPI (comm.finalize): MPICH 4.0 over UCX/TCP hangs in MPI_Finalize
  // with 3+ ranks on different nodes (a rank closing its endpoints waits for a peer already in the
  // PMI barrier). So across nodes (automatic) or always (skip) the ranks meet in a barrier and exit
  // without MPI_Finalize; otherwise (mpi) MPI_Finalize runs under a watchdog. Either wait is bounded
  // by `timeout_s` (0 = forever).
  void set_finalize(FinalizePolicy how, double timeout_s);
  // Ends MPI after a finished command, flushing output first; the process exits with `code` even
  // when the wait had to be given up (saying so).
  void finalize(ExitCode code);
  // Tears the whole job down at once (a fault seen by this rank alone).
  [[noreturn]] void abort(ExitCode code);

 private:
  // Waits for a request every rank takes part in, within the agreement bound.
  void wait_agreed(Request& req);
  // This node's ranks (local_ranks_, local_rank_) and cores (own_cores_, node_cores_).
  void learn_node();
  int rank_ = 0, size_ = 1, local_ranks_ = 1, local_rank_ = 0;
  int own_cores_ = 1, node_cores_ = 1;
  bool threads_funneled_ = false;  // MPI granted MPI_THREAD_FUNNELED or more
  std::vector<std::string> hosts_;
  double agree_timeout_s_ = kStartupAgreementS;
  const char* agree_phase_ = "start-up";
  FinalizePolicy finalize_ = FinalizePolicy::automatic;
  double finalize_timeout_s_ = 30;
};

}  // namespace pipetrain
