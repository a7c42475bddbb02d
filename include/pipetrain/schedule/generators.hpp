// The schedule generators: each builds one stage's action list for one step (schedule/actions.hpp).
// The registry (schedule/registry.hpp) names them for parallel.schedule.
#pragma once
#include "pipetrain/schedule/actions.hpp"

namespace pipetrain {

// GPipe: all M forwards (receiving from stage-1 and sending to stage+1 as needed), then all M
// backwards in reverse micro-batch order, as in the classic GPipe slot diagram (F0..F3 then B3..B0).
ActionList gpipe_schedule(int stage, int n_stages, int micro_batches);

// 1F1B (PipeDream-Flush): P-1-stage forwards to fill the pipeline, then one forward and one
// backward alternately, then the remaining backwards. Same bubble as GPipe, but a stage holds
// the activations of at most P - stage micro-batches instead of M.
ActionList one_f_one_b_schedule(int stage, int n_stages, int micro_batches);

// Interleaved 1F1B (Narayanan et al. 2021, as in Megatron-LM): each rank runs its V chunks on
// groups of P micro-batches (chunk 0 on micro-batches 0..P-1, chunk 1 on the same, ..., then the
// next group), 1F1B after a warm-up of 2(P-1-stage) + (V-1)P chunk-forwards; backwards visit the
// chunks in reverse. Needs M a multiple of P. Bubble (P-1)/(VM+P-1), V times less idle time than
// 1F1B's, for more activations: stage 0 holds P + (P-1)/V stages' worth (1F1B: P).
ActionList interleaved_schedule(int stage, int n_stages, int micro_batches, int chunks);

// ZB-H1 ("Zero Bubble Pipeline Parallelism", Qi et al. 2023): backward split into B (input
// gradient, sent upstream at once) and W (parameter gradient); 1F1B's order of forwards and B's,
// with stage s running W of micro-batch i right after B of micro-batch i + s (the last s W's at the
// end). With unit costs F = B = W the step takes 3M + P - 1 slots for M >= P (2M + 2P - 1 below),
// against 1F1B's 3(M + P - 1): 27 against 33 at P = 4, M = 8. Stage s holds min(M, P - s)
// micro-batches between F and B, as 1F1B does (the paper's memory count), but min(M, P) between F
// and W, where a micro-batch's activations are released here.
ActionList zb_h1_schedule(int stage, int n_stages, int micro_batches);

}  // namespace pipetrain
