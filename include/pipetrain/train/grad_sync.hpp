// The step boundary's gradient and parameter exchanges between replicas, and the one world-wide
// agreement (gradient norm, stop signal, NaN/Inf) that makes every rank decide alike whether to
// apply the update and whether to stop.
//
// Without sharding (parallel.zero = 0) each replica's gradients are all-reduced and every replica
// updates everything. Sharded (parallel.zero >= 1) each tensor's gradient is reduce-scattered, so
// a replica receives the summed gradient of its own row slab (OptimizerShard) and updates that
// slab with the AdamW state it alone keeps. Under ZeRO-1 and 2 the updated slabs are then
// all-gathered back into every replica's weights before their next forward; ZeRO-2 receives the
// summed slabs into the optimizer's compact gradient and frees the whole buffer after the step.
// ZeRO-3 gathers weights layer by layer instead (param_fetch.hpp).
#pragma once
#include <cstddef>
#include <deque>
#include <string>
#include <vector>

#include "pipetrain/compute/device.hpp"
#include "pipetrain/config/choices.hpp"
#include "pipetrain/dist/comm.hpp"
#include "pipetrain/model/model.hpp"
#include "pipetrain/model/optim.hpp"
#include "pipetrain/model/optimizer_shard.hpp"
#include "pipetrain/observe/trace.hpp"

namespace pipetrain {

// Sums gradients over the replicas (when there are several) and the tied embedding's two halves
// (`tied`: this stage's wte or its copy when the first and last stage share it; null otherwise),
// starting as soon as gradients are complete: each chunk's last backward reports, block by block,
// the offset from which the buffer is final (it falls from the head to the embeddings, chunk
// after chunk), so work starts from the end of the buffer and overlaps the rest of that backward.
// Unsharded, the buffer is all-reduced in buckets of `bucket` floats cut from its end, each expert
// tensor of expert parallelism alone over the replicas holding its experts; sharded,
// each tensor is reduce-scattered as a whole (its slabs lie in rank order), into the buffer itself
// (ZeRO-1) or into `shard_out`, a compact buffer of the shard's slabs (ZeRO-2, 3). Either way the
// sequence of collectives depends only on the layout, so every replica posts the same, and the
// tied halves are summed after the replicas' sums, in the same order in both modes. Under ZeRO-2
// and 3 a tensor's whole gradient is released as soon as its reduce-scatter is seen complete.
// Sharded, at most OptimizerShard::reduce_window floats travel at once: a tensor that would pass
// it waits for the oldest first.
// On the GPU the collectives run on a host copy: each bucket (each tensor, sharded) is downloaded
// on the copy stream as soon as it is final, while the backward goes on, and its collective is
// posted once it has arrived, in the order the copies were started (the same on every replica).
class GradReducer {
 public:
  // `grads`: the stage's flat gradient buffer of `floats`; `host`: where the collectives run, its
  // host copy on the GPU (pinned), `grads` itself on the CPU.
  GradReducer(Comm& comm, float* grads, float* host, size_t floats, size_t bucket,
              const std::vector<ParamTensor>& params, const OptimizerShard& shard, const ParamTensor* tied,
              float* shard_out = nullptr);
  void begin_step();
  // Gradients from `offset` to the end of the buffer are final: post what lies there.
  void done_from(size_t offset);
  // Posts what is left, waits, sums over the tensor group the norms' gradients under sequence
  // parallelism and the shares of a key/value head several tensor ranks hold, then the tied
  // halves. Unsharded, every rank then holds the summed gradient everywhere; sharded, of its own
  // slabs (ZeRO-1: in the buffer, the rest of which is scratch; ZeRO-2, 3: in `shard_out`).
  // Returns the seconds spent waiting for the replicas. Spans go to `trace`.
  double finish(Trace& trace);
  const float* shard_out() const { return shard_out_; }
  // Sharded: the most gradient floats that travelled at once since begin_step (at most the window).
  size_t most_travelling() const { return most_travelling_; }

 private:
  void post(const ParamTensor& p);  // sharded: one tensor's reduce-scatter, within the window
  // The collective of one tensor (sharded) or of the bucket [begin, end) (unsharded, `p` null), at
  // once on the CPU, once its host copy has arrived on the GPU.
  void launch(const ParamTensor* p, size_t begin, size_t end);
  void issue(const ParamTensor* p, size_t begin, size_t end);  // posts it
  void issue_arrived(bool wait);  // issues the downloads that have arrived (all of them: `wait`)
  void posted(Request r, std::string name, Group group = Group::data);  // in flight from now
  void progress();                 // tests what is in flight, noting when each completes
  void completed(size_t request);  // notes it, and under ZeRO-2, 3 releases its whole gradient
  void wait_for(size_t request);   // waits for it, then completed()
  void sum_shared(const ParamTensor& p, const OptimizerShard::Slab& mine);  // a shared key/value head's
  SlabView summed() const { return shard_out_ ? SlabView{shard_out_, true} : SlabView{grads_, false}; }
  Comm& comm_;
  float* device_grads_;  // the stage's buffer
  float* grads_;         // where the collectives run (device_grads_ on the CPU)
  size_t floats_;
  size_t bucket_, posted_from_ = 0;
  const std::vector<ParamTensor>& params_;
  const OptimizerShard& shard_;
  const ParamTensor* tied_;
  float* shard_out_;
  size_t next_tensor_ = 0;  // sharded: params_[next_tensor_ - 1] is the last tensor not yet posted
  size_t window_, travelling_ = 0, most_travelling_ = 0;  // sharded: the floats that may travel at once, do, did
  std::vector<Request> reqs_;
  struct Downloading {  // the GPU's: a collective whose gradients are on their way to the host
    DeviceCopy copy;
    const ParamTensor* tensor;
    size_t begin, end;
  };
  std::deque<Downloading> downloading_;
  struct InFlight {  // per request, for the trace's exchange track
    std::string name;
    Group group;  // its communicator (a timeout names its members)
    double posted_s, done_s = -1;
  };
  std::vector<InFlight> flight_;
  std::vector<const ParamTensor*> posted_;  // sharded: the tensor of each request
  std::vector<int> counts_, offsets_;
  std::vector<float> shared_sum_;            // a shared key/value tensor's whole gradient, summed by the group
  std::vector<const ParamTensor*> experts_;  // expert parallelism's tensors, in buffer order
};

// ZeRO-1 and 2's all-gather of the updated slabs, one collective per tensor, posted after the update and
// waited for chunk by chunk just before that chunk's first forward of the next step (the waits of
// the stages before it overlap it). On the GPU the weights travel through `staging`, a host copy.
class ParamGather {
 public:
  // Each chunk's gathers go on `trace`'s exchange track (when given) from posting to arrival.
  ParamGather(Comm& comm, Stage& stage, const OptimizerShard& shard, std::vector<float>* staging,
              Trace* trace = nullptr);
  double post();         // the bytes the gathers bring in (0: nothing to gather)
  bool wait(int chunk);  // true if there was something to wait for
  void wait_all();

 private:
  Comm& comm_;
  Stage& stage_;
  const OptimizerShard& shard_;
  std::vector<float>* staging_;
  Trace* trace_;
  double posted_s_ = 0;
  std::vector<std::vector<Request>> reqs_;  // per chunk
  std::vector<int> chunk_of_;               // per tensor
  std::vector<int> counts_, offsets_;
};

// What rank 0 alone decides and the step agreement carries to every rank.
struct RootSays {
  bool window_long_enough = false;                       // the straggler window may close (observe/stragglers.hpp)
  StragglerAction straggler_act = StragglerAction::log;  // a straggler move after this step (log: none)
};

struct StepSync {
  double dp_wait_s;               // time waiting for the replicas' gradient sums (not pipeline bubble)
  double norm;                    // global gradient norm over all stages, before clipping
  bool stop;                      // some rank received a stop signal
  bool finite;                    // every rank's loss and gradients are finite: the update may be applied
  bool window_long_enough;        // the straggler window may close (observe/stragglers.hpp)
  StragglerAction straggler_act;  // rank 0's straggler move (train/straggler_action.hpp), after this step
  double norm_s;                  // compute time of the squared norm (counted as compute, not waiting)
};

// After the schedule: finish the gradient sums (1/D is already in the loss scale; on the GPU through
// `staging`, and under ZeRO-2, 3 the summed slabs uploaded from the reducer's host copy), then one small
// all-reduce over all ranks carries the squared norm (each rank's share: the first replica's whole
// buffer unsharded, every replica's own slabs sharded), the stop flag and a non-finite flag: the
// step's only world-wide synchronisation, so every rank decides alike whether to stop and whether
// to apply the update. A NaN anywhere reaches the rank that checks it through the sums. It also
// carries what rank 0 alone decides (`root`): that the straggler window has run its course, so
// every rank closes it at the same logging step, and a straggler move every rank makes after the step.
// `trace` gets a span per part: waits inside the collectives as waits (a late
// peer and the transfer itself are not told apart; comm_wait_s counts them alike), host copies as
// all-reduce work, the norm as optimizer work.
StepSync sync_step(Stage& stage, Comm& comm, GradReducer& reducer, AdamW& adam, std::vector<float>* staging,
                   bool out_of_time, RootSays root, double loss_sum, Trace& trace);

}  // namespace pipetrain
