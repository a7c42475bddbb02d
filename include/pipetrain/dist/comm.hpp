// All communication of a run goes through Comm (with World, the only code that calls MPI). It owns
// the pipeline (the P stages of one replica), data (the D replicas of one stage), tied-embedding
// (first + last stage of one replica) and tensor (the tp ranks of one stage and replica)
// communicators, each per tensor rank where tp > 1; under expert parallelism also the expert group
// (ep consecutive replicas, which split the experts) and the expert-data group (the replicas holding
// the same experts, one per expert group); and every wait: nonblocking calls completed by
// polling MPI_Test, yielding the core when ranks outnumber cores (MPICH's blocking calls spin), and
// giving up after comm.timeout_s with an error that names what was awaited.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "pipetrain/dist/request.hpp"
#include "pipetrain/dist/topology.hpp"
#include "pipetrain/dist/world.hpp"

namespace pipetrain {

// What a wait is for, so a timeout can say which stage, peer, node and micro-batch it was stuck on.
enum class Group { none, data, tied, tensor, world, expert, expert_data };  // the communicator of a collective
struct WaitLabel {
  const char* what;     // "recv activation", "send gradient", "all-reduce gradients", ...
  int peer_stage = -1;  // a pipeline peer of the same replica; -1: none
  int micro_batch = -1;
  Group group = Group::none;  // a collective: its members are named on timeout
  int peer_rank = -1;         // a peer by world rank (smoke test)
};

class Comm {
 public:
  // Builds the grid communicators of `topo` over `world`. Waits poll as `wait` says (automatic:
  // yield when this node's ranks outnumber its cores) and give up after `timeout_s`.
  Comm(World& world, const Topology& topo, WaitPolicy wait, double timeout_s);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  World& world() const { return world_; }
  const Topology& topo() const { return topo_; }
  WaitMode wait_mode() const { return mode_; }

  // Pipeline p2p with the neighbouring stage of the same replica. Buffers must stay alive until
  // the request is waited on.
  Request isend(const float* buf, size_t n, int peer_stage, int tag);
  Request irecv(float* buf, size_t n, int peer_stage, int tag);
  // Waits, adding the time spent to wait_seconds(). Throws CommTimeout. True when the request was
  // still incomplete at the wait's first test (it completed during the wait).
  bool wait(Request& req, const WaitLabel& label);
  void wait_all(std::vector<Request>& reqs, const WaitLabel& label);
  // One MPI_Test of each pending request (nulled when complete), without waiting: MPICH moves a
  // large message only inside MPI calls, so a rank calling this between kernels lets its sends and
  // receives travel while it computes.
  void progress(std::vector<Request>& reqs);

  // In-place sums. data: over the D replicas of this stage (or, with Group::expert_data, the
  // replicas holding this rank's experts); world: over all ranks; tied: between first and last
  // stage (no-op when P = 1).
  Request iallreduce_data(float* buf, size_t n, Group group = Group::data);
  // ZeRO over the data group, on one tensor's range `buf` whose part r is counts[r] elements at
  // offsets[r] (consecutive, in rank order). Reduce-scatter: this rank's summed part goes to `out`,
  // or, without one, is left at the START of buf (MPI's in-place rule; the caller moves it to
  // offsets[rank] after the wait). All-gather: every rank's part, at its offset, ends up on every
  // rank, this rank's sent from `mine` (or from its place in buf). `group`: the data group, or an
  // expert tensor's replicas (Group::expert_data).
  Request ireduce_scatter_data(float* buf, const std::vector<int>& counts, float* out = nullptr,
                               Group group = Group::data);
  Request iallgather_data(float* buf, const std::vector<int>& counts, const std::vector<int>& offsets,
                          const float* mine = nullptr, Group group = Group::data);
  void allreduce_world(double* buf, size_t n);
  void allreduce_tied(float* buf, size_t n);
  // In place over the tensor group, waited for at once: the layers cannot go on without them.
  void allreduce_tensor(float* buf, size_t n);
  void allreduce_tensor(double* buf, size_t n);
  void allmax_tensor(float* buf, size_t n);
  // Sequence parallelism: every tensor rank's `n` values, in rank order, into `whole` (tp x n);
  // and the group's sum of `whole` (tp x n), rank r keeping part r in `part` (n).
  void allgather_tensor(const float* part, float* whole, size_t n);
  void reduce_scatter_tensor(const float* whole, float* part, size_t n);
  // Expert parallelism, waited for at once: `n` ints to each expert-group rank (send[j n ...]), n
  // from each into recv; and send_counts[j] floats (consecutive in send, in rank order) to rank j,
  // recv_counts[i] from rank i into recv, in rank order.
  void alltoall_expert(const int* send, int* recv, int n);
  void alltoall_expert(const float* send, const std::vector<int>& send_counts, float* recv,
                       const std::vector<int>& recv_counts);

  // Gathers `n` values from every rank to world rank 0 (out sized world*n there).
  void gather_to_root(const double* mine, size_t n, std::vector<double>& out);
  void gather_to_root(const uint64_t* mine, size_t n, std::vector<uint64_t>& out);
  // Gathers one string of any length from every rank to world rank 0 (out has world entries there).
  void gather_to_root(const std::string& mine, std::vector<std::string>& out);
  // Smoke test: `reps` round trips of n bytes with world rank `peer` (this rank starts when
  // `initiator`); returns seconds per round trip. A barrier lets the other ranks wait politely.
  double ping_pong(int peer, bool initiator, std::vector<char>& buf, int reps);
  void barrier();
  // A barrier for a wait known to be long (another rank's turn at a timed workload): it tests once
  // a millisecond, leaving the cores to the rank that works. Gives up after comm.timeout_s too.
  void idle_barrier();
  // World rank 0's `value` on every rank.
  double broadcast_from_root(double value);
  // The first replica's (dp rank 0's) `n` values on every replica of this stage.
  void broadcast_in_data(uint64_t* values, size_t n);
  // The stage's first rank's (dp rank 0, tensor rank 0) `n` values on every rank of this stage.
  void broadcast_in_stage(uint64_t* values, size_t n);

  // How this rank's `clock` reads against world rank 0's: rank 0's clock ~ clock() + offset_s,
  // within +- error_s. Each rank makes `rounds` round trips with rank 0, which answers with its
  // clock; the fastest trip is kept, and rank 0's answer is placed at its middle (Cristian's
  // method: the error is at most half that trip). Collective; rank 0 gets {0, 0}.
  struct ClockOffset {
    double offset_s = 0, error_s = 0;
  };
  ClockOffset clock_offset_to_root(int rounds, const std::function<double()>& clock);

  // Checks every rank holds the same value (e.g. spec hash); returns false otherwise.
  bool all_equal(uint64_t value);
  // Start-up handshake: each stage sends the description of the activation it will send (shape,
  // element size) to the next stage, which compares it with what it expects to receive. Returns
  // false on this rank if the previous stage announced something else, so a mismatch is an error
  // at start-up rather than a hang or garbage mid-run.
  bool boundary_agrees(const std::vector<int64_t>& send_desc, const std::vector<int64_t>& recv_desc);

  // Seconds this rank has spent inside waits since the last reset; of them, inside waits for the
  // data group's collectives (gradient sums, ZeRO's gathers): its exposed data-parallel exchanges.
  double wait_seconds() const { return wait_s_; }
  double data_wait_seconds() const { return data_wait_s_; }
  void reset_wait_seconds() { wait_s_ = data_wait_s_ = 0; }

 private:
  // As wait(), throwing CommTimeout naming `label`; `pending`: whether the first test found it incomplete.
  void poll(Request& req, const WaitLabel& label, WaitMode mode, bool* pending = nullptr);
  void poll(Request& req, const WaitLabel& label) { poll(req, label, mode_); }
  // As poll, for a collective inside the layers' compute: its time is theirs (the tp_comm kernel
  // class), not a wait between passes.
  void poll_in_compute(Request& req, const WaitLabel& label);
  World& world_;
  Topology topo_;
  struct Groups;  // the pipeline, data and tied-embedding communicators (comm.cpp)
  std::unique_ptr<Groups> groups_;
  WaitMode mode_ = WaitMode::spin;
  double timeout_s_;
  double wait_s_ = 0, data_wait_s_ = 0;
};

}  // namespace pipetrain
