// The step boundary's gradient work: the data-parallel all-reduce in buckets that start while the
// last backward still runs, the tied embedding's two halves summed, and the one world-wide
// agreement (gradient norm, stop signal, NaN/Inf) that makes every rank decide alike whether to
// apply the update and whether to stop.
#pragma once
#include <cstddef>
#include <vector>

#include "pipetrain/dist/comm.hpp"
#include "pipetrain/model/model.hpp"
#include "pipetrain/observe/trace.hpp"

namespace pipetrain {

// The data-parallel gradient all-reduce, in buckets started as soon as their gradients are
// complete: each chunk's last backward reports, block by block, the offset from which the buffer
// is final (it falls from the head to the embeddings, chunk after chunk), so buckets are cut from
// the end of the buffer and overlap the rest of that backward. Bucket bounds depend only on the layout, so
// every replica posts the same sequence.
class GradReducer {
 public:
  GradReducer(Comm& comm, std::vector<float>& grads, size_t bucket) : comm_(comm), grads_(grads), bucket_(bucket) {}
  void begin_step() { posted_from_ = grads_.size(); }
  // Gradients from `offset` to the end of the buffer are final: post every whole bucket there.
  void done_from(size_t offset);
  // Posts what is left and waits for every bucket.
  void finish();

 private:
  Comm& comm_;
  std::vector<float>& grads_;
  size_t bucket_, posted_from_ = 0;
  std::vector<MPI_Request> reqs_;
};

struct StepSync {
  double dp_wait_s;  // time in the data-parallel all-reduce (not pipeline bubble)
  double norm;       // global gradient norm over all stages, before clipping
  bool stop;         // some rank received a stop signal
  bool finite;       // every rank's loss and gradients are finite: the update may be applied
  double norm_s;     // compute time of the squared norm (counted as compute, not waiting)
};

// After the schedule: finish averaging gradients over the replicas (1/D is already in the loss
// scale), sum the tied embedding's two halves (tied_wte: the stage's wte if it takes part), then
// one small all-reduce over all ranks carries the squared norm (from the first replica of each
// stage), the stop flag and a non-finite flag: the step's only world-wide synchronisation, so
// every rank decides alike whether to stop and whether to apply the update.
// On the GPU (comm.backend = mpi) the sums over replicas and tied halves run on `staging`, a host
// copy of the gradients the reducer was built on. `trace` gets a span per part: the waits inside
// the collectives as waits (a late peer and the transfer itself are not told apart; comm_wait_s
// counts them alike), the host copies as all-reduce work, the norm as optimizer work.
StepSync sync_step(Stage& stage, Comm& comm, GradReducer* reducer, std::vector<float>* staging,
                   const ParamTensor* tied_wte, bool out_of_time, double loss_sum, Trace& trace);

}  // namespace pipetrain
