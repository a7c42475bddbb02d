// The V-shaped schedules: two chunks per rank laid in a vee (schedule/placement.hpp), rank s
// holding virtual stages s and 2P-1-s, so a micro-batch goes down the ranks and back up and the
// turn at the last rank is a hand-off to itself.
#pragma once
#include "pipetrain/schedule/actions.hpp"

namespace pipetrain {

// ZB-V ("Zero Bubble Pipeline Parallelism", Qi et al. 2023, section 6): backward split into B and
// W, listed by scheduling unit costs F = B = W per chunk on all ranks together, each slot taking
// the first that can run of: a B (the oldest micro-batch, the later chunk first), an F while the
// rank holds fewer than 2P chunk-micro-batches (a micro-batch is held from its F to its W: 1F1B's
// peak of P whole-stage micro-batches on the first stage, here on every rank), the oldest pending
// W. With M >= 2P the step takes 6M + ~P chunk slots against ZB-H1's 6M + 2(P-1).
ActionList zb_v_schedule(int stage, int n_stages, int micro_batches);

// DualPipeV (DeepSeek-V3's DualPipe folded into a V, as in torch.distributed.pipelining): after a
// warm-up, each step of the steady state pairs one chunk's forward with the other chunk's full
// backward, so the pair's messages travel while its other half computes (the executor keeps MPI
// progressing between blocks); the cool-down splits the last backwards into B and W to fill the
// ramp. Per rank s: 2(P-1-s) forwards of chunk 0; s+1 forwards of each chunk; P-1-s times B of
// chunk 1 and its forward; then pairs; then the backwards. Needs M >= 2P (every rank reaches the
// steady state).
ActionList dualpipe_v_schedule(int stage, int n_stages, int micro_batches);

}  // namespace pipetrain
