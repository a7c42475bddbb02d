// ZeRO-3's weights: each data-parallel replica keeps only its row slab of every tensor (the
// optimizer's compact master copy, AdamW::weight_shard; the stage's flat weight buffer is dropped
// after start-up), and a layer's whole tensors are all-gathered into a slot just before a pass
// reads them, one collective per tensor over the data group, the next layer's posted as the pass
// starts (so it travels while the pass computes). The passes read each tensor where it was put
// (WeightFetcher::where). After the pass the tensors are released when `reshard` is set (their slot
// is free for the next layer: memory stays in use, and is not faulted in again, from pass to
// pass); otherwise they stay until the step's end (release_all), so every micro-batch of the step
// shares one gather. At the step's end the slots' memory goes back (device.hpp's release_values).
// Replicas post the same gathers in the same order: they run the same action list.
#pragma once
#include <cstddef>
#include <deque>
#include <vector>

#include "pipetrain/dist/comm.hpp"
#include "pipetrain/model/model.hpp"
#include "pipetrain/model/optim.hpp"
#include "pipetrain/observe/trace.hpp"

namespace pipetrain {

class LayerGather : public WeightFetcher {
 public:
  // On the GPU the gathers run on `staging`, a host buffer as long as the stage's flat buffers
  // (null on the CPU). Each gather goes on `trace`'s exchange track, from posting to arrival; a
  // pass's wait for its layer on the rank's own track.
  LayerGather(Comm& comm, Stage& stage, AdamW& adam, bool reshard, std::vector<float>* staging, Trace& trace);
  void fetch(int chunk, int layer, Pass pass) override;
  void done(int chunk, int layer, Pass pass) override;
  float* where(size_t offset) override;  // a gathered tensor's weights (throws std::logic_error if absent)
  // Waits for the gathers still travelling, releases every tensor and gives the slots' memory
  // back: the step (or an evaluation) is over.
  void release_all();

  // The bytes gathered into this rank's slots since the last call.
  double take_gathered_bytes();
  // The floats of the slots (present or free): what the gathered weights take at most so far.
  size_t slot_floats() const;

 private:
  struct Held {
    std::vector<Request> travelling;  // its all-gather, until waited for
    double posted_s = 0;
    float* at = nullptr;  // its place in a slot, from placing to release
    int slot = -1;
    bool present = false;  // gathered
    int users = 0;         // passes reading it now
  };
  // Memory for the tensors of a layer placed together, reused by a later layer of the same size
  // once every tensor in it is released.
  struct Slot {
    Floats values;
    int holds = 0;  // tensors placed in it
  };
  void place(const std::vector<size_t>& tensors);  // the absent ones, together in one slot
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
  std::deque<Slot> slots_;                               // (a deque: places stay put as it grows)
  std::vector<int> counts_, offsets_;
  double gathered_bytes_ = 0;
};

}  // namespace pipetrain
