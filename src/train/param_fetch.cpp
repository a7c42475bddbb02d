#include "pipetrain/train/param_fetch.hpp"

#include <algorithm>
#include <stdexcept>

#include "pipetrain/compute/device.hpp"
#include "pipetrain/util/clock.hpp"

namespace pipetrain {

LayerGather::LayerGather(Comm& comm, Stage& stage, AdamW& adam, bool reshard, std::vector<float>* staging, Trace& trace)
    : comm_(comm),
      stage_(stage),
      adam_(adam),
      reshard_(reshard),
      staging_(staging),
      trace_(trace),
      held_(stage.params().size()) {
  const ParamTensor* first = stage.params().data();
  for (int c = 0; c < stage.chunks(); ++c) {
    units_.emplace_back();
    for (int l = 0; l < stage.layers(c); ++l) {
      std::vector<size_t> tensors;
      for (const ParamTensor* p : stage.layer_params(c, l)) tensors.push_back(static_cast<size_t>(p - first));
      units_.back().push_back(std::move(tensors));
    }
  }
}

void LayerGather::fetch(int chunk, int layer, Pass pass) {
  place(unit(chunk, layer));
  for (size_t t : unit(chunk, layer)) post(t);
  // The layer the pass reads next, posted now so that it travels while this one computes (a
  // backward ends at the first block: the embedding's backward reads no weights).
  const int next = pass == Pass::forward ? layer + 1 : layer - 1;
  if (next < stage_.layers(chunk) && next >= (pass == Pass::forward ? 0 : 1)) {
    place(unit(chunk, next));
    for (size_t t : unit(chunk, next)) post(t);
  }
  const double t0 = now_s(), waited0 = comm_.data_wait_seconds();
  for (size_t t : unit(chunk, layer)) {
    wait(t);
    ++held_[t].users;
  }
  if (comm_.data_wait_seconds() > waited0) trace_.span("wait weights (zero 3)", "wait", t0, now_s());
}

void LayerGather::done(int chunk, int layer, Pass) {
  for (size_t t : unit(chunk, layer))
    if (--held_[t].users == 0 && reshard_) release(t);
}

float* LayerGather::where(size_t offset) {
  const std::vector<ParamTensor>& params = stage_.params();
  const auto it = std::lower_bound(params.begin(), params.end(), offset,
                                   [](const ParamTensor& p, size_t o) { return p.offset < o; });
  const size_t t = static_cast<size_t>(it - params.begin());
  if (it == params.end() || it->offset != offset || !held_[t].present)
    throw std::logic_error("LayerGather: weights at offset " + std::to_string(offset) +
                           " read before they were gathered");
  return held_[t].at;
}

void LayerGather::release_all() {
  for (size_t t = 0; t < held_.size(); ++t) {
    wait(t);  // a layer posted ahead that no pass read
    release(t);
  }
  for (Slot& s : slots_) release_values(s.values.data(), s.values.size());
}

double LayerGather::take_gathered_bytes() {
  const double bytes = gathered_bytes_;
  gathered_bytes_ = 0;
  return bytes;
}

size_t LayerGather::slot_floats() const {
  size_t floats = 0;
  for (const Slot& s : slots_) floats += s.values.size();
  return floats;
}

void LayerGather::place(const std::vector<size_t>& tensors) {
  size_t floats = 0;  // of the tensors neither gathered nor on their way (a tied wte may be either)
  for (size_t t : tensors)
    if (!held_[t].at) floats += stage_.params()[t].size;
  if (floats == 0) return;
  // A free slot of the same size (the layers of a stage are mostly alike), else a new one.
  auto slot = std::find_if(slots_.begin(), slots_.end(),
                           [&](const Slot& s) { return s.holds == 0 && s.values.size() == floats; });
  if (slot == slots_.end()) slot = slots_.insert(slots_.end(), Slot{Floats(floats), 0});
  float* at = slot->values.data();
  for (size_t t : tensors) {
    Held& h = held_[t];
    if (h.at) continue;
    h.at = at;
    h.slot = static_cast<int>(slot - slots_.begin());
    ++slot->holds;
    at += stage_.params()[t].size;
  }
}

void LayerGather::post(size_t tensor) {
  Held& h = held_[tensor];
  if (h.present || !h.travelling.empty()) return;
  const ParamTensor& p = stage_.params()[tensor];
  const OptimizerShard::Slab& slab = adam_.shard().slabs()[tensor];
  adam_.shard().rank_parts(p, counts_, offsets_);
  const float* mine = adam_.weight_shard().data() + slab.state_offset;
  h.posted_s = now_s();
  const Group group = p.expert ? Group::expert_data : Group::data;
  if (staging_) {  // the GPU's: this rank's slab down to its place in the host copy, gathered there
    download(staging_->data() + slab.begin, mine, slab.size() * sizeof(float));
    h.travelling.push_back(comm_.iallgather_data(staging_->data() + p.offset, counts_, offsets_, nullptr, group));
  } else {
    h.travelling.push_back(comm_.iallgather_data(h.at, counts_, offsets_, mine, group));
  }
}

void LayerGather::wait(size_t tensor) {
  Held& h = held_[tensor];
  if (h.travelling.empty()) return;
  comm_.wait_all(h.travelling, {"data-parallel weight all-gather (ZeRO-3)", -1, -1, Group::data});
  const ParamTensor& p = stage_.params()[tensor];
  trace_.exchange("all-gather " + p.name, h.posted_s, now_s());
  if (staging_) upload(h.at, staging_->data() + p.offset, p.size * sizeof(float));
  h.present = true;
  gathered_bytes_ += static_cast<double>(p.size) * sizeof(float);
}

void LayerGather::release(size_t tensor) {
  Held& h = held_[tensor];
  if (!h.present) return;
  --slots_[static_cast<size_t>(h.slot)].holds;
  h = Held{};
}

}  // namespace pipetrain
