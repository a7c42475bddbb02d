#include "pipetrain/train/grad_sync.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "pipetrain/compute/device.hpp"
#include "pipetrain/dist/signals.hpp"
#include "pipetrain/model/optim.hpp"
#include "pipetrain/util/clock.hpp"

namespace pipetrain {

GradReducer::GradReducer(Comm& comm, float* grads, float* host, size_t floats, size_t bucket,
                         const std::vector<ParamTensor>& params, const OptimizerShard& shard, const ParamTensor* tied,
                         float* shard_out)
    : comm_(comm),
      device_grads_(grads),
      grads_(host),
      floats_(floats),
      bucket_(bucket),
      params_(params),
      shard_(shard),
      tied_(tied),
      shard_out_(shard_out),
      window_(OptimizerShard::reduce_window(params, bucket)) {
  if (shard.shards_grads() != (shard_out != nullptr))
    throw std::logic_error("GradReducer: a compact gradient buffer is for ZeRO-2 and 3 alone");
  for (const ParamTensor& p : params)
    if (p.expert && !shard.sharded()) experts_.push_back(&p);  // sharded, each tensor travels alone anyway
}

void GradReducer::begin_step() {
  posted_from_ = floats_;
  next_tensor_ = params_.size();
  most_travelling_ = 0;
}

void GradReducer::post(const ParamTensor& p) {
  if (travelling_ + p.size > window_) issue_arrived(true);  // a download counts as travelling
  for (size_t oldest = 0; travelling_ + p.size > window_ && oldest < reqs_.size(); ++oldest) wait_for(oldest);
  travelling_ += p.size;
  most_travelling_ = std::max(most_travelling_, travelling_);
  launch(&p, p.offset, p.offset + p.size);
}

void GradReducer::launch(const ParamTensor* p, size_t begin, size_t end) {
  if (grads_ == device_grads_) return issue(p, begin, end);
  downloading_.push_back(
      {DeviceCopy(grads_ + begin, device_grads_ + begin, (end - begin) * sizeof(float)), p, begin, end});
}

void GradReducer::issue_arrived(bool wait) {
  while (!downloading_.empty() && (wait || downloading_.front().copy.done())) {
    Downloading& d = downloading_.front();
    d.copy.wait();
    issue(d.tensor, d.begin, d.end);
    downloading_.pop_front();
  }
}

void GradReducer::issue(const ParamTensor* p, size_t begin, size_t end) {
  const Group group = p && p->expert ? Group::expert_data : Group::data;
  if (p && p->expert && !shard_.sharded()) {  // over the replicas holding the same experts
    posted(comm_.iallreduce_data(grads_ + begin, end - begin, group), "all-reduce expert gradients " + p->name, group);
    return;
  }
  if (!p) {
    posted(comm_.iallreduce_data(grads_ + begin, end - begin),
           "all-reduce gradients [" + std::to_string(begin) + ", " + std::to_string(end) + ")");
    return;
  }
  shard_.rank_parts(*p, counts_, offsets_);
  float* out = shard_out_ ? shard_out_ + shard_.slabs()[p - params_.data()].state_offset : nullptr;
  posted(comm_.ireduce_scatter_data(grads_ + begin, counts_, out, group), "reduce-scatter " + p->name, group);
  posted_.push_back(p);
}

void GradReducer::posted(Request r, std::string name, Group group) {
  reqs_.push_back(std::move(r));
  flight_.push_back({std::move(name), group, now_s()});
}

void GradReducer::progress() {
  issue_arrived(false);
  comm_.progress(reqs_);
  for (size_t i = 0; i < reqs_.size(); ++i)
    if (!reqs_[i].active()) completed(i);
}

void GradReducer::completed(size_t i) {
  if (flight_[i].done_s >= 0) return;
  flight_[i].done_s = now_s();
  if (shard_.sharded()) travelling_ -= posted_[i]->size;
  // ZeRO-2, 3: the tensor's summed slab is in shard_out, and nothing adds to its whole gradient
  // again this step: its memory goes back now, not at the step's end.
  if (shard_out_) release_values(device_grads_ + posted_[i]->offset, posted_[i]->size);
}

void GradReducer::wait_for(size_t i) {
  comm_.wait(reqs_[i], {"data-parallel gradient sum", -1, -1, flight_[i].group});
  completed(i);
}

void GradReducer::done_from(size_t offset) {
  if (comm_.topo().dp == 1) return;
  progress();              // MPICH moves a collective on only inside MPI calls: between blocks is one
  if (shard_.sharded()) {  // whole tensors, from the last
    for (; next_tensor_ > 0 && params_[next_tensor_ - 1].offset >= offset; --next_tensor_)
      post(params_[next_tensor_ - 1]);
    return;
  }
  while (posted_from_ > offset) {
    // An expert tensor is summed alone, over the replicas holding its experts (none when each
    // expert group is the whole data group); a bucket of the rest stops at one.
    const auto below = std::lower_bound(experts_.begin(), experts_.end(), posted_from_,
                                        [](const ParamTensor* p, size_t at) { return p->offset < at; });
    const ParamTensor* expert = below == experts_.begin() ? nullptr : *(below - 1);
    const size_t expert_end = expert ? expert->offset + expert->size : 0;
    if (expert && expert_end == posted_from_) {
      if (expert->offset < offset) break;
      if (comm_.topo().expert_replicas() > 1) launch(expert, expert->offset, expert_end);
      posted_from_ = expert->offset;
      continue;
    }
    const size_t start = std::max(posted_from_ - std::min(bucket_, posted_from_), expert_end);
    if (start < offset) break;  // the rest of this bucket is not final yet
    launch(nullptr, start, posted_from_);
    posted_from_ = start;
  }
}

double GradReducer::finish(Trace& trace) {
  done_from(0);
  issue_arrived(true);  // the GPU's last downloads: their collectives are posted
  TraceLaps laps(trace);
  if (grads_ != device_grads_ && comm_.topo().dp == 1) {  // no replicas: the tensor group's or tied sums alone
    download(grads_, device_grads_, floats_ * sizeof(float));
    laps.mark("gradients to host", "comm");
  }
  const double wait0 = comm_.wait_seconds();
  for (size_t i = 0; i < reqs_.size(); ++i) {
    wait_for(i);
    trace.exchange(flight_[i].name, flight_[i].posted_s, flight_[i].done_s);
  }
  reqs_.clear();
  flight_.clear();
  const double dp_wait = comm_.wait_seconds() - wait0;
  if (shard_.sharded()) {
    laps.mark("wait gradient reduce-scatter", "wait");
    // In place (ZeRO-1), MPI leaves each rank's summed part at the start of the tensor's range:
    // move it to its slab.
    if (!shard_out_)
      for (const ParamTensor* p : posted_) {
        const int me = shard_.part_of(*p).rank;
        shard_.rank_parts(*p, counts_, offsets_);
        if (offsets_[me] > 0 && counts_[me] > 0)
          std::memmove(grads_ + p->offset + offsets_[me], grads_ + p->offset, counts_[me] * sizeof(float));
      }
    posted_.clear();
  } else if (comm_.topo().dp > 1) {
    laps.mark("wait gradient all-reduce", "wait");
  }
  // The tensor group's sums, of the part of each tensor this rank keeps (all of it, or its slab).
  // Sequence parallelism: a norm's gradient on each tensor rank is its token rows' share.
  for (size_t i = 0; i < params_.size(); ++i) {
    const OptimizerShard::Slab& mine = shard_.slabs()[i];
    if (params_[i].sums_over_tokens) comm_.allreduce_tensor(summed().at(mine), mine.size());
    if (params_[i].tp.shared()) sum_shared(params_[i], mine);
  }
  // The tied halves, summed over the replicas already. Sharded, the first and the last stage's
  // replica r own the same rows of wte: only those travel.
  if (tied_) {
    const OptimizerShard::Slab& mine = shard_.slabs()[tied_ - params_.data()];
    comm_.allreduce_tied(summed().at(mine), mine.size());
    laps.mark("wait tied-embedding sum", "wait");
  }
  return dp_wait;
}

// A key/value head held by several tensor ranks: each has its query heads' share of the head's
// gradient. The group sums the whole tensor, each rank's part placed where it lies in it (zeros
// elsewhere: the sum is exact), and each keeps its part; the whole k/v is a small tensor.
void GradReducer::sum_shared(const ParamTensor& p, const OptimizerShard::Slab& mine) {
  const size_t begin = mine.begin - p.offset;
  const std::vector<ElementRun> runs = whole_runs(p.tp, p.shape, begin, begin + mine.size());
  float* slab = summed().at(mine);  // element `local` of the tensor is slab[local - begin]
  shared_sum_.assign(p.tp.whole_size(), 0.f);
  for (const ElementRun& r : runs) std::copy_n(slab + (r.local - begin), r.count, &shared_sum_[r.whole]);
  comm_.allreduce_tensor(shared_sum_.data(), shared_sum_.size());
  for (const ElementRun& r : runs) std::copy_n(&shared_sum_[r.whole], r.count, slab + (r.local - begin));
}

ParamGather::ParamGather(Comm& comm, Stage& stage, const OptimizerShard& shard, std::vector<float>* staging,
                         Trace* trace)
    : comm_(comm), stage_(stage), shard_(shard), staging_(staging), trace_(trace), reqs_(stage.chunks()) {
  for (const ParamTensor& p : stage.params()) {
    int chunk = 0;
    while (chunk + 1 < stage.chunks() && stage.chunk_offset(chunk + 1) <= p.offset) ++chunk;
    chunk_of_.push_back(chunk);
  }
}

double ParamGather::post() {
  if (!shard_.sharded() || shard_.shards_weights()) return 0;  // ZeRO-3 gathers layer by layer
  Floats& w = stage_.weights();
  if (staging_) download(staging_->data(), w.data(), w.size() * sizeof(float));
  float* base = staging_ ? staging_->data() : w.data();
  posted_s_ = now_s();
  const std::vector<ParamTensor>& params = stage_.params();
  for (size_t i = 0; i < params.size(); ++i) {
    shard_.rank_parts(params[i], counts_, offsets_);
    const Group group = params[i].expert ? Group::expert_data : Group::data;
    reqs_[chunk_of_[i]].push_back(comm_.iallgather_data(base + params[i].offset, counts_, offsets_, nullptr, group));
  }
  return sizeof(float) * static_cast<double>(w.size());
}

bool ParamGather::wait(int chunk) {
  if (reqs_[chunk].empty()) return false;
  comm_.wait_all(reqs_[chunk], {"data-parallel parameter all-gather", -1, -1, Group::data});
  if (trace_) trace_->exchange("all-gather updated weights, chunk " + std::to_string(chunk), posted_s_, now_s());
  if (!staging_) return true;
  const size_t begin = stage_.chunk_offset(chunk);
  const size_t end = chunk + 1 < stage_.chunks() ? stage_.chunk_offset(chunk + 1) : stage_.weights().size();
  upload(stage_.weights().data() + begin, staging_->data() + begin, (end - begin) * sizeof(float));
  return true;
}

void ParamGather::wait_all() {
  for (int c = 0; c < stage_.chunks(); ++c) wait(c);
}

StepSync sync_step(Stage& stage, Comm& comm, GradReducer& reducer, AdamW& adam, std::vector<float>* staging,
                   bool out_of_time, RootSays root, double loss_sum, Trace& trace) {
  const OptimizerShard& shard = adam.shard();
  const double dp_wait = reducer.finish(trace);
  TraceLaps laps(trace);
  Floats& g = stage.grads();
  if (staging) {
    if (shard.shards_grads())
      upload(adam.grad_shard().data(), reducer.shard_out(), shard.state_floats() * sizeof(float));
    else upload(g.data(), staging->data(), g.size() * sizeof(float));
    laps.mark("gradients to device", "comm");
  }
  // Each rank checks what it vouches for: unsharded, the first replica the whole (summed) buffer
  // but the experts, which the first replica of each expert part vouches for; sharded, every
  // replica its slabs. Each rank checks its own loss.
  const Topology& topo = comm.topo();
  const double norm_t0 = now_s();
  const double sq = grad_sq_sum(stage.params(), adam.grads_in(g), shard, [&](const ParamTensor& p) {
    return shard.sharded() || (p.expert ? topo.expert_replica() : topo.dp_rank) == 0;
  });
  const double norm_s = now_s() - norm_t0;
  laps.mark("gradient norm", "optimizer");
  const bool bad = !std::isfinite(sq) || !std::isfinite(loss_sum);
  double sums[5] = {bad ? 0.0 : sq, stop_requested() || out_of_time ? 1.0 : 0.0, bad ? 1.0 : 0.0,
                    root.window_long_enough ? 1.0 : 0.0, static_cast<double>(root.straggler_act)};
  comm.allreduce_world(sums, 5);
  laps.mark("wait step agreement (norm, stop, finite)", "wait");
  const bool finite = sums[2] == 0;
  return {dp_wait,     finite ? std::sqrt(sums[0]) : NAN,
          sums[1] > 0, finite,
          sums[3] > 0, static_cast<StragglerAction>(static_cast<int>(sums[4])),
          norm_s};
}

}  // namespace pipetrain
