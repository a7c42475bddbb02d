#include "pipetrain/train/grad_sync.hpp"

#include <algorithm>
#include <cmath>

#include "pipetrain/compute/device.hpp"
#include "pipetrain/dist/signals.hpp"
#include "pipetrain/model/optim.hpp"
#include "pipetrain/util/clock.hpp"

namespace pipetrain {

void GradReducer::done_from(size_t offset) {
  while (posted_from_ > offset) {
    const size_t start = posted_from_ - std::min(bucket_, posted_from_);
    if (start < offset) break;  // the rest of this bucket is not final yet
    reqs_.push_back(comm_.iallreduce_data(grads_.data() + start, posted_from_ - start));
    posted_from_ = start;
  }
}

void GradReducer::finish() {
  done_from(0);
  comm_.wait_all(reqs_, {"data-parallel gradient all-reduce", -1, -1, Group::data});
}

StepSync sync_step(Stage& stage, Comm& comm, GradReducer* reducer, std::vector<float>* staging,
                   const ParamTensor* tied_wte, bool out_of_time, double loss_sum, Trace& trace) {
  double t = now_s();
  auto span = [&](const char* name, const char* category) {
    const double t1 = now_s();
    trace.span(name, category, t, t1);
    t = t1;
  };
  Floats& g = stage.grads();
  const bool through_host = staging && (reducer || tied_wte);
  if (through_host) download(staging->data(), g.data(), g.size() * sizeof(float)), span("gradients to host", "comm");
  float* summed = staging ? staging->data() : g.data();
  const double wait0 = comm.wait_seconds();
  if (reducer) reducer->finish(), span("wait gradient all-reduce", "wait");
  const double dp_wait = comm.wait_seconds() - wait0;
  if (tied_wte) comm.allreduce_tied(summed + tied_wte->offset, tied_wte->size), span("wait tied-embedding sum", "wait");
  if (through_host) upload(g.data(), staging->data(), g.size() * sizeof(float)), span("gradients to device", "comm");
  // The gradient is checked where its norm is taken, on the first replica: the all-reduce has
  // summed every replica's part into it, so a NaN anywhere is there too. Each rank checks its own
  // loss; the world all-reduce of the flag makes every rank decide alike.
  const double norm_t0 = now_s();
  const double sq = comm.topo().dp_rank == 0 ? grad_sq_sum(stage.params(), g) : 0.0;
  const double norm_s = now_s() - norm_t0;
  span("gradient norm", "optimizer");
  const bool bad = !std::isfinite(sq) || !std::isfinite(loss_sum);
  double sums[3] = {bad ? 0.0 : sq, stop_requested() || out_of_time ? 1.0 : 0.0, bad ? 1.0 : 0.0};
  comm.allreduce_world(sums, 3);
  span("wait step agreement (norm, stop, finite)", "wait");
  const bool finite = sums[2] == 0;
  return {dp_wait, finite ? std::sqrt(sums[0]) : NAN, sums[1] > 0, finite, norm_s};
}

}  // namespace pipetrain
