#include "pipetrain/dist/comm.hpp"

#include <mpi.h>

#include "mpi_handles.hpp"
#include "pipetrain/util/clock.hpp"

#include <cmath>
#include <cstdio>

namespace pipetrain {
namespace {

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

}  // namespace

struct Comm::Groups {
  MPI_Comm pipe = MPI_COMM_NULL, data = MPI_COMM_NULL, tied = MPI_COMM_NULL, tensor = MPI_COMM_NULL,
           stage = MPI_COMM_NULL, expert = MPI_COMM_NULL, expert_data = MPI_COMM_NULL;
  // The replicas a data-parallel exchange runs over: the data group, or an expert tensor's.
  MPI_Comm replicas(Group g) const { return g == Group::expert_data ? expert_data : data; }
};

Comm::Comm(World& world, const Topology& topo, WaitPolicy wait, double timeout_s)
    : world_(world), topo_(topo), groups_(std::make_unique<Groups>()), timeout_s_(timeout_s) {
  // Every group but the tensor group and the stage's links ranks of one tensor rank.
  const int tp = topo.tp, k = topo.tp_rank;
  MPI_Comm_split(MPI_COMM_WORLD, topo.dp_rank * tp + k, topo.stage, &groups_->pipe);
  MPI_Comm_split(MPI_COMM_WORLD, topo.stage * tp + k, topo.dp_rank, &groups_->data);
  bool tied_member = topo.tied_apart() && (topo.first_stage() || topo.holds_head());
  MPI_Comm_split(MPI_COMM_WORLD, tied_member ? topo.dp_rank * tp + k : MPI_UNDEFINED, topo.stage, &groups_->tied);
  MPI_Comm_split(MPI_COMM_WORLD, topo.stage * topo.dp + topo.dp_rank, k, &groups_->tensor);
  MPI_Comm_split(MPI_COMM_WORLD, topo.stage, topo.dp_rank * tp + k, &groups_->stage);
  // Expert parallelism: a stage's replicas (of one tensor rank) cut into groups of ep consecutive
  // ones; and across the groups, those at the same place in theirs.
  const int cells = topo.stage * tp + k;
  MPI_Comm_split(MPI_COMM_WORLD, cells * topo.expert_replicas() + topo.expert_replica(), topo.ep_rank(),
                 &groups_->expert);
  MPI_Comm_split(MPI_COMM_WORLD, cells * topo.ep + topo.ep_rank(), topo.expert_replica(), &groups_->expert_data);
  switch (wait) {
    case WaitPolicy::spin:
      mode_ = WaitMode::spin;
      break;
    case WaitPolicy::yield:
      mode_ = WaitMode::yield;
      break;
    case WaitPolicy::automatic:
      mode_ = world.local_ranks() > world.cores() ? WaitMode::yield : WaitMode::spin;
  }
}

Comm::~Comm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Comm* c : {&groups_->pipe, &groups_->data, &groups_->tied, &groups_->tensor, &groups_->stage,
                      &groups_->expert, &groups_->expert_data})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

Request Comm::isend(const float* buf, size_t n, int peer_stage, int tag) {
  Request r;
  MPI_Isend(buf, static_cast<int>(n), MPI_FLOAT, peer_stage, tag, groups_->pipe, RequestOut(r));
  return r;
}

Request Comm::irecv(float* buf, size_t n, int peer_stage, int tag) {
  Request r;
  MPI_Irecv(buf, static_cast<int>(n), MPI_FLOAT, peer_stage, tag, groups_->pipe, RequestOut(r));
  return r;
}

void Comm::poll(Request& req, const WaitLabel& label, WaitMode mode, bool* pending) {
  if (!req.active()) return;
  const double waited = wait_s_;
  if (poll_until_done(req, mode, timeout_s_, wait_s_, pending)) {
    if (label.group == Group::data || label.group == Group::expert_data) data_wait_s_ += wait_s_ - waited;
    return;
  }
  std::string msg = "stage " + std::to_string(topo_.stage) + " (" + world_.where(topo_.world_rank) + ", dp " +
                    std::to_string(topo_.dp_rank) + ") waited more than " + seconds(timeout_s_) +
                    " (comm.timeout_s) for " + label.what;
  const bool receiving = std::string(label.what).rfind("recv", 0) == 0;
  if (label.peer_stage >= 0)
    msg += std::string(receiving ? " from" : " to") + " stage " + std::to_string(label.peer_stage) + " (" +
           world_.where(topo_.rank_of(label.peer_stage, topo_.dp_rank)) + ")";
  if (label.peer_rank >= 0) msg += " with " + world_.where(label.peer_rank);
  if (label.micro_batch >= 0) msg += ", micro-batch " + std::to_string(label.micro_batch);
  // A collective cannot say which member is missing: name them all, with their nodes.
  std::vector<int> members;
  if (label.group == Group::data)
    for (int d = 0; d < topo_.dp; ++d) members.push_back(topo_.rank_of(topo_.stage, d));
  if (label.group == Group::tensor)
    for (int k = 0; k < topo_.tp; ++k) members.push_back(topo_.rank_of(topo_.stage, topo_.dp_rank, k));
  if (label.group == Group::tied)
    members = {topo_.rank_of(0, topo_.dp_rank), topo_.rank_of(topo_.head_stage(), topo_.dp_rank)};
  if (label.group == Group::expert)
    for (int e = 0; e < topo_.ep; ++e)
      members.push_back(topo_.rank_of(topo_.stage, topo_.dp_rank - topo_.ep_rank() + e));
  if (label.group == Group::expert_data)
    for (int d = topo_.ep_rank(); d < topo_.dp; d += topo_.ep) members.push_back(topo_.rank_of(topo_.stage, d));
  if (!members.empty()) {
    msg += "; one of its members is lost or stalled:";
    for (int r : members) msg += (r == members.front() ? " " : ", ") + world_.where(r);
  }
  if (label.group == Group::world) msg += world_.suspects();
  throw CommTimeout(msg);
}

void Comm::poll_in_compute(Request& req, const WaitLabel& label) {
  const double waited = wait_s_;
  poll(req, label);
  wait_s_ = waited;
}

bool Comm::wait(Request& req, const WaitLabel& label) {
  bool pending = false;
  poll(req, label, mode_, &pending);
  return pending;
}

void Comm::progress(std::vector<Request>& reqs) {
  for (Request& r : reqs) {
    if (!r.active()) continue;
    MPI_Request m = MpiHandles::get(r);
    int done = 0;
    MPI_Test(&m, &done, MPI_STATUS_IGNORE);
    r = MpiHandles::make(m);
  }
}

void Comm::wait_all(std::vector<Request>& reqs, const WaitLabel& label) {
  for (auto& r : reqs) poll(r, label);
  reqs.clear();
}

Request Comm::iallreduce_data(float* buf, size_t n, Group group) {
  Request r;
  MPI_Iallreduce(MPI_IN_PLACE, buf, static_cast<int>(n), MPI_FLOAT, MPI_SUM, groups_->replicas(group), RequestOut(r));
  return r;
}

Request Comm::ireduce_scatter_data(float* buf, const std::vector<int>& counts, float* out, Group group) {
  MPI_Comm c = groups_->replicas(group);
  Request r;
  if (out) MPI_Ireduce_scatter(buf, out, counts.data(), MPI_FLOAT, MPI_SUM, c, RequestOut(r));
  else MPI_Ireduce_scatter(MPI_IN_PLACE, buf, counts.data(), MPI_FLOAT, MPI_SUM, c, RequestOut(r));
  return r;
}

Request Comm::iallgather_data(float* buf, const std::vector<int>& counts, const std::vector<int>& offsets,
                              const float* mine, Group group) {
  MPI_Comm c = groups_->replicas(group);
  Request r;
  if (mine)
    MPI_Iallgatherv(mine, counts[group == Group::expert_data ? topo_.expert_replica() : topo_.dp_rank], MPI_FLOAT, buf,
                    counts.data(), offsets.data(), MPI_FLOAT, c, RequestOut(r));
  else
    MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts.data(), offsets.data(), MPI_FLOAT, c,
                    RequestOut(r));
  return r;
}

void Comm::allreduce_world(double* buf, size_t n) {
  Request r;
  MPI_Iallreduce(MPI_IN_PLACE, buf, static_cast<int>(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, RequestOut(r));
  poll(r, {"step-boundary all-reduce (gradient norm, stop signal)", -1, -1, Group::world});
}

void Comm::allreduce_tied(float* buf, size_t n) {
  if (groups_->tied == MPI_COMM_NULL) return;
  Request r;
  MPI_Iallreduce(MPI_IN_PLACE, buf, static_cast<int>(n), MPI_FLOAT, MPI_SUM, groups_->tied, RequestOut(r));
  poll(r, {"tied-embedding gradient sum between first and last stage", -1, -1, Group::tied});
}

void Comm::allreduce_tensor(float* buf, size_t n) {
  Request r;
  MPI_Iallreduce(MPI_IN_PLACE, buf, static_cast<int>(n), MPI_FLOAT, MPI_SUM, groups_->tensor, RequestOut(r));
  poll_in_compute(r, {"tensor-parallel sum", -1, -1, Group::tensor});
}

void Comm::allreduce_tensor(double* buf, size_t n) {
  Request r;
  MPI_Iallreduce(MPI_IN_PLACE, buf, static_cast<int>(n), MPI_DOUBLE, MPI_SUM, groups_->tensor, RequestOut(r));
  poll_in_compute(r, {"tensor-parallel sum (softmax statistics)", -1, -1, Group::tensor});
}

void Comm::allmax_tensor(float* buf, size_t n) {
  Request r;
  MPI_Iallreduce(MPI_IN_PLACE, buf, static_cast<int>(n), MPI_FLOAT, MPI_MAX, groups_->tensor, RequestOut(r));
  poll_in_compute(r, {"tensor-parallel max (softmax statistics)", -1, -1, Group::tensor});
}

void Comm::allgather_tensor(const float* part, float* whole, size_t n) {
  Request r;
  MPI_Iallgather(part, static_cast<int>(n), MPI_FLOAT, whole, static_cast<int>(n), MPI_FLOAT, groups_->tensor,
                 RequestOut(r));
  poll_in_compute(r, {"tensor-parallel all-gather (sequence parallel)", -1, -1, Group::tensor});
}

void Comm::reduce_scatter_tensor(const float* whole, float* part, size_t n) {
  Request r;
  MPI_Ireduce_scatter_block(whole, part, static_cast<int>(n), MPI_FLOAT, MPI_SUM, groups_->tensor, RequestOut(r));
  poll_in_compute(r, {"tensor-parallel reduce-scatter (sequence parallel)", -1, -1, Group::tensor});
}

void Comm::alltoall_expert(const int* send, int* recv, int n) {
  Request r;
  MPI_Ialltoall(send, n, MPI_INT, recv, n, MPI_INT, groups_->expert, RequestOut(r));
  poll_in_compute(r, {"expert-parallel all-to-all (rows per expert)", -1, -1, Group::expert});
}

void Comm::alltoall_expert(const float* send, const std::vector<int>& send_counts, float* recv,
                           const std::vector<int>& recv_counts) {
  std::vector<int> send_offsets(send_counts.size()), recv_offsets(recv_counts.size());
  for (size_t j = 1; j < send_counts.size(); ++j) send_offsets[j] = send_offsets[j - 1] + send_counts[j - 1];
  for (size_t i = 1; i < recv_counts.size(); ++i) recv_offsets[i] = recv_offsets[i - 1] + recv_counts[i - 1];
  Request r;
  MPI_Ialltoallv(send, send_counts.data(), send_offsets.data(), MPI_FLOAT, recv, recv_counts.data(),
                 recv_offsets.data(), MPI_FLOAT, groups_->expert, RequestOut(r));
  poll_in_compute(r, {"expert-parallel all-to-all (token rows)", -1, -1, Group::expert});
}

void Comm::gather_to_root(const double* mine, size_t n, std::vector<double>& out) {
  out.assign(topo_.world_rank == 0 ? n * static_cast<size_t>(world_.size()) : 0, 0.0);
  Request r;
  MPI_Igather(mine, static_cast<int>(n), MPI_DOUBLE, out.data(), static_cast<int>(n), MPI_DOUBLE, 0, MPI_COMM_WORLD,
              RequestOut(r));
  poll(r, {"gather of step metrics to rank 0", -1, -1, Group::world});
}

void Comm::gather_to_root(const uint64_t* mine, size_t n, std::vector<uint64_t>& out) {
  out.assign(topo_.world_rank == 0 ? n * static_cast<size_t>(world_.size()) : 0, 0);
  Request r;
  MPI_Igather(mine, static_cast<int>(n), MPI_UINT64_T, out.data(), static_cast<int>(n), MPI_UINT64_T, 0, MPI_COMM_WORLD,
              RequestOut(r));
  poll(r, {"gather to rank 0", -1, -1, Group::world});
}

void Comm::gather_to_root(const std::string& mine, std::vector<std::string>& out) {
  const int n = world_.size();
  // Each rank sends its string plus a terminator: MPICH (ch4) was seen to lose track of later
  // collectives on the communicator after an MPI_Igatherv in which every count was zero.
  const std::string padded = mine + '\0';
  int len = static_cast<int>(padded.size());
  std::vector<int> lens(topo_.world_rank == 0 ? n : 0), offsets;
  Request r;
  MPI_Igather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD, RequestOut(r));
  poll(r, {"gather of trace sizes to rank 0", -1, -1, Group::world});
  std::string all;
  if (topo_.world_rank == 0) {
    int total = 0;
    for (int l : lens) {
      offsets.push_back(total);
      total += l;
    }
    all.resize(total);
  }
  MPI_Igatherv(padded.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR, 0, MPI_COMM_WORLD,
               RequestOut(r));
  poll(r, {"gather of traces to rank 0", -1, -1, Group::world});
  out.clear();
  for (int i = 0; i < static_cast<int>(lens.size()); ++i) out.push_back(all.substr(offsets[i], lens[i] - 1));
}

double Comm::ping_pong(int peer, bool initiator, std::vector<char>& buf, int reps) {
  const int n = static_cast<int>(buf.size()), tag = 77;
  const double t0 = now_s();
  for (int i = 0; i < reps; ++i) {
    Request r;
    for (int leg = 0; leg < 2; ++leg) {
      if ((leg == 0) == initiator) MPI_Isend(buf.data(), n, MPI_CHAR, peer, tag, MPI_COMM_WORLD, RequestOut(r));
      else MPI_Irecv(buf.data(), n, MPI_CHAR, peer, tag, MPI_COMM_WORLD, RequestOut(r));
      poll(r, {"smoke-test ping-pong", -1, -1, Group::none, peer});
    }
  }
  return (now_s() - t0) / reps;
}

void Comm::barrier() {
  Request r;
  MPI_Ibarrier(MPI_COMM_WORLD, RequestOut(r));
  poll(r, {"barrier", -1, -1, Group::world});
}

void Comm::idle_barrier() {
  Request r;
  MPI_Ibarrier(MPI_COMM_WORLD, RequestOut(r));
  poll(r, {"barrier", -1, -1, Group::world}, WaitMode::idle);
}

double Comm::broadcast_from_root(double value) {
  Request r;
  MPI_Ibcast(&value, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD, RequestOut(r));
  poll(r, {"broadcast from rank 0", -1, -1, Group::world});
  return value;
}

void Comm::broadcast_in_data(uint64_t* values, size_t n) {
  Request r;
  MPI_Ibcast(values, static_cast<int>(n), MPI_UINT64_T, 0, groups_->data, RequestOut(r));
  poll(r, {"broadcast from the first replica", -1, -1, Group::data});
}

void Comm::broadcast_in_stage(uint64_t* values, size_t n) {
  Request r;
  MPI_Ibcast(values, static_cast<int>(n), MPI_UINT64_T, 0, groups_->stage, RequestOut(r));
  poll(r, {"broadcast from the stage's first rank", -1, -1, Group::none});
}

Comm::ClockOffset Comm::clock_offset_to_root(int rounds, const std::function<double()>& clock) {
  const int tag = 78, me = topo_.world_rank;
  ClockOffset best{0, me == 0 ? 0 : INFINITY};
  for (int peer = 1; peer < world_.size(); ++peer) {  // one rank at a time: rank 0 answers at once
    if (me != 0 && me != peer) continue;
    for (int i = 0; i < rounds; ++i) {
      double root_time = 0;
      Request r;
      if (me == 0) {
        MPI_Irecv(&root_time, 1, MPI_DOUBLE, peer, tag, MPI_COMM_WORLD, RequestOut(r));
        poll(r, {"clock exchange", -1, -1, Group::none, peer});
        root_time = clock();
        MPI_Isend(&root_time, 1, MPI_DOUBLE, peer, tag, MPI_COMM_WORLD, RequestOut(r));
        poll(r, {"clock exchange", -1, -1, Group::none, peer});
        continue;
      }
      const double sent = clock();
      MPI_Isend(&sent, 1, MPI_DOUBLE, 0, tag, MPI_COMM_WORLD, RequestOut(r));
      poll(r, {"clock exchange", -1, -1, Group::none, 0});
      MPI_Irecv(&root_time, 1, MPI_DOUBLE, 0, tag, MPI_COMM_WORLD, RequestOut(r));
      poll(r, {"clock exchange", -1, -1, Group::none, 0});
      const double received = clock();
      if ((received - sent) / 2 < best.error_s) best = {root_time - (sent + received) / 2, (received - sent) / 2};
    }
  }
  return best;
}

bool Comm::all_equal(uint64_t value) {
  uint64_t lo = value, hi = value;
  Request r[2];
  MPI_Iallreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD, RequestOut(r[0]));
  MPI_Iallreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD, RequestOut(r[1]));
  poll(r[0], {"start-up agreement"});
  poll(r[1], {"start-up agreement"});
  return lo == hi;
}

bool Comm::boundary_agrees(const std::vector<int64_t>& send_desc, const std::vector<int64_t>& recv_desc) {
  const int n = static_cast<int>(recv_desc.size());
  std::vector<int64_t> got(recv_desc.size(), -1);
  Request r[2];
  if (!topo_.last_stage())
    MPI_Isend(send_desc.data(), static_cast<int>(send_desc.size()), MPI_INT64_T, topo_.stage + 1, 0, groups_->pipe,
              RequestOut(r[0]));
  if (!topo_.first_stage()) MPI_Irecv(got.data(), n, MPI_INT64_T, topo_.stage - 1, 0, groups_->pipe, RequestOut(r[1]));
  poll(r[0], {"start-up shape handshake", topo_.stage + 1});
  poll(r[1], {"start-up shape handshake", topo_.stage - 1});
  return topo_.first_stage() || got == recv_desc;
}

}  // namespace pipetrain
