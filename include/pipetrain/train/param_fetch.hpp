// ZeRO-3's weights: each data-parallel replica keeps only its row slab of every tensor (the
// optimizer's compact master copy, AdamW::weight_shard), and a layer's whole tensors are
// all-gathered into the stage's flat buffer just before a pass reads them, one collective per
// tensor over the data group, the next layer's posted as the pass starts (so it travels while the
// pass computes). After the pass they are released (device.hpp's release_values: the memory goes
// back) when `reshard` is set; otherwise they stay until the step's end (release_all), so every
// micro-batch of the step shares one gather. Replicas post the same gathers in the same order:
// they run the same action list.
#pragma once
#include <cstddef>
#include <vector>

#include "pipetrain/dist/comm.hpp"
#include "pipetrain/model/model.hpp"
#include "pipetrain/model/optim.hpp"
#include "pipetrain/observe/trace.hpp"

namespace pipetrain {

class LayerGather : public WeightFetcher {
 public:
  // On the GPU the gathers run on `staging`, a host copy of the flat buffer (null on the CPU).
  // Each gather goes on `trace`'s exchange track, from posting to arrival; a pass's wait for its
  // layer on the rank's own track.
  LayerGather(Comm& comm, Stage& stage, AdamW& adam, bool reshard, std::vector<float>* staging, Trace& trace);
  void fetch(int chunk, int layer, Pass pass) override;
  void done(int chunk, int layer, Pass pass) override;
  // Waits for the gathers still travelling and releases every tensor: the step (or an evaluation)
  // is over.
  void release_all();

  // The bytes gathered into this rank's buffer since the last call.
  double take_gathered_bytes();

 private:
  struct Held {
    std::vector<Request> travelling;  // its all-gather, until waited for
    double posted_s = 0;
    bool present = false;  // gathered into the flat buffer
    int users = 0;         // passes reading it now
  };
  void post(size_t tensor);
  void wait(size_t tensor);
  void release(size_t tensor);
  const std::vector<size_t>& unit(int chunk, int layer) const { return units_[chunk][layer]; }

  Comm& comm_;
  Stage& stage_;
  AdamW& adam_;
  bool reshard_;
  std::vector<float>* staging_;
  Trace& trace_;
  std::vector<std::vector<std::vector<size_t>>> units_;  // [chunk][layer]: indices into stage.params()
  std::vector<Held> held_;                               // per tensor
  std::vector<int> counts_, offsets_;
  double gathered_bytes_ = 0;
};

}  // namespace pipetrain
