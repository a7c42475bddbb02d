// What a machine takes for the pieces of a training step: the planner's input. Per micro-batch of
// a given number of samples, one block's forward (F), input-gradient (B) and weight-gradient (W)
// passes, and the same for the embedding and for the LM head with its loss; the update (zeroing
// gradients, their norm, AdamW) per parameter; a message between pipeline neighbours and an
// all-reduce over a data-parallel group, by size. They come from `pipetrain plan --calibrate`
// (measured on this machine with the real kernels and, when launched on two or more ranks, the
// real messages), from a finished run's trace (tools/costs_from_run.hpp), or from a per-rank peak
// FLOP/s and a link bandwidth for a machine not at hand.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "pipetrain/config/spec.hpp"

namespace pipetrain {

struct PassCosts {
  double f = 0, b = 0, w = 0;  // seconds per micro-batch: forward, input gradient, weight gradient
  double backward() const { return b + w; }
};

// A virtual stage's passes: `blocks` blocks', plus the embedding's on the first and the head's on
// the last (in whatever unit the parts are given: seconds, FLOPs).
PassCosts stage_passes(const PassCosts& block, const PassCosts& embed, const PassCosts& head, int blocks, bool first,
                       bool last);

struct MachineCosts {
  std::string source;                                   // how they were obtained (plan says so)
  int d_model = 0, n_head = 0, seq_len = 0, vocab = 0;  // the model shape measured
  std::string family = "gpt2";                          // and its block (block_family)
  struct AtSize {
    int samples = 1;  // per micro-batch
    PassCosts block, embed, head;
    // One block under recompute = block and = stage: f its forward (keeping what the mode keeps),
    // b its whole backward with the forward run again (w 0). Absent (0) in costs from a peak,
    // where a recomputing backward is taken as F + B + W.
    PassCosts block_recompute[2];
  };
  std::vector<AtSize> compute;   // by increasing samples
  double adamw_s_per_param = 0;  // the update: zeroing gradients, their norm and AdamW
  struct Transfer {
    double bytes = 0, seconds = 0;
  };
  std::vector<Transfer> p2p;        // one message between two ranks, by increasing size
  std::vector<Transfer> allreduce;  // an all-reduce over allreduce_ranks ranks, by size
  int allreduce_ranks = 2;
  // The same inside a node (NVLink), where a tensor group runs; empty: the link above.
  std::vector<Transfer> node_allreduce;
  // Calibrated on a CPU: a blocking all-gather over allreduce_ranks ranks into a buffer of `bytes`
  // (the rank's own slab copied from its master), as ZeRO-3 gathers a layer into a slot. There the
  // ranks' own cores copy the slabs in, between their kernels, so nothing hides it. Empty
  // (GPUs, costs from peaks): a gather travels beside compute at half an all-reduce's cost.
  std::vector<Transfer> gather_refill;

  // Interpolated linearly between measured sizes, proportionally beyond them.
  PassCosts block(int samples) const;
  PassCosts embed(int samples) const;
  PassCosts head(int samples) const;
  // One block's passes under `mode`: for block and stage f and a backward b that re-runs the
  // forward (w 0).
  PassCosts block_under(Recompute mode, int samples) const;
  double p2p_s(double bytes) const;
  // Ring all-reduce over `ranks`: each rank moves 2(D-1)/D of the bytes in 2(D-1) steps, scaled
  // from the measured group size. 0 for one rank.
  double allreduce_s(double bytes, int ranks) const;
  // The same over a tensor group, which stays within a node: on node_allreduce where given.
  double node_allreduce_s(double bytes, int ranks) const;
  double gather_refill_s(double bytes) const;  // 0 where not measured
  double adamw_s(double params) const { return adamw_s_per_param * params; }

  nlohmann::json to_json() const;
  // Throws SpecError naming `where` and the missing or bad field.
  static MachineCosts from_json(const nlohmann::json& j, const std::string& where);
  static MachineCosts read(const std::string& path);
  // Whether `path` holds a cost file (what plan --calibrate --force may replace).
  static bool is_cost_file(const std::string& path);
  // A machine described by its peak: each pass at `flops_per_s` x `efficiency` (the FLOPs of our
  // kernels for `spec`'s model), messages at `link_bytes_per_s` after a 10 us latency (a tensor
  // group's at `node_link_bytes_per_s` where given, 0: the same), AdamW at a memory bandwidth of
  // peak / 200 FLOP per byte.
  static MachineCosts from_peak(const RunSpec& spec, double flops_per_s, double efficiency, double link_bytes_per_s,
                                double node_link_bytes_per_s = 0);
  // The FLOPs of each pass per sample, as our kernels count them, in the seconds' places (from_peak
  // divides them by a rate; a run's measured passes are shared out in their proportions).
  static AtSize flops_per_sample(const RunSpec& spec);
  // No costs yet, for `spec`'s model shape (what check_fits compares).
  static MachineCosts for_model(const RunSpec& spec);
  // Refuses (SpecError) costs measured on another model width, head count, context or vocabulary.
  void check_fits(const RunSpec& spec, const std::string& where) const;
};

}  // namespace pipetrain
