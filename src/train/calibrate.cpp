#include "pipetrain/train/calibrate.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "pipetrain/compute/blas.hpp"
#include "pipetrain/compute/cpu_features.hpp"
#include "pipetrain/compute/device.hpp"
#include "pipetrain/compute/parallel_for.hpp"
#include "pipetrain/dist/comm.hpp"
#include "pipetrain/model/model.hpp"
#include "pipetrain/model/optim.hpp"
#include "pipetrain/util/clock.hpp"
#include "pipetrain/util/stats.hpp"

namespace pipetrain {
namespace {

constexpr int kRepeats = 5;
// The whole sweep over micro-batch sizes is measured this many times and each figure is the
// median over the sweeps: a burst of noise (another tenant, a frequency step) that outlasts one
// size's repeats then spoils one sweep, not that size's figure.
constexpr int kSweeps = 3;

std::string cpu_model() {  // named next to every figure measured on it
  const std::string& name = cpu_features().model_name;
  return name.empty() ? "an unknown CPU" : name;
}

// Starts every timed repeat on all of the calibration's ranks at once: training runs every core
// at once, and on many machines busy cores slow each other (shared caches, memory bandwidth, a
// hyperthread sibling, a power budget), which a kernel timed beside idle or polling ranks misses.
using Together = std::function<void()>;

template <class F>
double median_seconds(const Together& together, F&& run) {
  run();  // warm-up: buffers sized, caches and pages touched
  std::vector<double> t;
  for (int i = 0; i < kRepeats; ++i) {
    together();
    const double t0 = now_s();
    run();
    finish_compute();
    t.push_back(now_s() - t0);
  }
  return median(t);
}

// A stage input or output gradient of n floats, standard normal, the same for a seed.
std::vector<float> normal_noise(size_t n, unsigned seed) {
  std::vector<float> noise(n);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (float& x : noise) x = normal(rng);
  return noise;
}

// F, B and W of one micro-batch through a one-block stage at virtual stage `vstage` of 3 (0: with
// the embedding, 1: the block alone, 2: with the head and loss).
PassCosts time_stage(const Together& together, const RunSpec& spec, int vstage) {
  Stage stage(spec, {{vstage, vstage, vstage + 1}}, 3, 1, 1.0f / (spec.train.global_batch * spec.model.seq_len));
  stage.init_params(1);
  const size_t n = static_cast<size_t>(spec.train.global_batch) * spec.model.seq_len;
  std::vector<int> tokens(n);
  for (size_t i = 0; i < n; ++i) tokens[i] = static_cast<int>(i * 7919 % spec.model.vocab);
  const std::vector<float> noise = normal_noise(stage.boundary_floats(), 1);
  Floats out(noise.size()), dout(noise.size()), dinp(noise.size());
  upload(dout.data(), noise.data(), noise.size() * sizeof(float));
  auto inputs = [&] {
    if (vstage == 0) stage.set_tokens(0, tokens.data());
    else upload(stage.input_buffer(0, 0), noise.data(), noise.size() * sizeof(float));
    if (vstage == 2) stage.set_targets(0, tokens.data());
  };
  const bool last = vstage == 2, first = vstage == 0;
  PassCosts c;
  c.f = median_seconds(together, [&] {
    inputs();
    stage.forward(0, 0, last ? nullptr : out.data());
    stage.discard(0, 0);
  });
  std::vector<double> b, w;
  for (int i = 0; i <= kRepeats; ++i) {  // B and W need a forward before them: timed apart
    inputs();
    stage.forward(0, 0, last ? nullptr : out.data());
    finish_compute();
    together();
    double t0 = now_s();
    stage.backward_input(0, 0, last ? nullptr : dout.data(), first ? nullptr : dinp.data());
    finish_compute();
    const double t1 = now_s();
    stage.backward_weight(0, 0);
    finish_compute();
    if (i > 0) {  // the first warms up
      b.push_back(t1 - t0);
      w.push_back(now_s() - t1);
    }
  }
  c.b = median(b);
  c.w = median(w);
  return c;
}

// One middle block under recompute `mode`: its forward (keeping what the mode keeps) and its whole
// backward, which runs the forward again.
PassCosts time_recompute(const Together& together, RunSpec spec, Recompute mode) {
  spec.parallel.recompute = mode;
  Stage stage(spec, {{1, 1, 2}}, 3, 1, 1.0f / (spec.train.global_batch * spec.model.seq_len));
  stage.init_params(1);
  const std::vector<float> noise = normal_noise(stage.boundary_floats(), 2);
  Floats out(noise.size()), dout(noise.size()), dinp(noise.size());
  upload(dout.data(), noise.data(), noise.size() * sizeof(float));
  std::vector<double> f, b;
  for (int i = 0; i <= kRepeats; ++i) {
    upload(stage.input_buffer(0, 0), noise.data(), noise.size() * sizeof(float));
    together();
    double t0 = now_s();
    stage.forward(0, 0, out.data());
    finish_compute();
    const double t1 = now_s();
    stage.backward(0, 0, dout.data(), dinp.data());
    finish_compute();
    if (i > 0) {  // the first warms up
      f.push_back(t1 - t0);
      b.push_back(now_s() - t1);
    }
  }
  return {median(f), median(b), 0};
}

PassCosts minus(const PassCosts& a, const PassCosts& b) {
  return {std::max(0.0, a.f - b.f), std::max(0.0, a.b - b.b), std::max(0.0, a.w - b.w)};
}

// A spec of three one-block virtual stages with `samples` per micro-batch, as a 1x1 run holds them.
RunSpec one_block_spec(const RunSpec& spec, int samples) {
  RunSpec s = spec;
  s.model.n_layer = 3;
  s.parallel.pp = s.parallel.dp = s.parallel.micro_batches = 1;
  s.parallel.virtual_stages = 1;
  s.parallel.recompute = Recompute::none;
  s.parallel.schedule = &schedule_named("gpipe");
  s.train.global_batch = samples;
  return s;
}

double adamw_s_per_param(const Together& together, const RunSpec& spec) {
  RunSpec s = one_block_spec(spec, 1);
  Stage stage(s, {{1, 1, 2}}, 3, 1, 1.f);
  stage.init_params(1);
  const OptimizerShard whole(stage.params(), 0, 1);
  AdamW opt(s.train, whole);
  // A step's work per parameter besides the passes: zeroing the gradients, their norm, AdamW.
  const double t = median_seconds(together, [&] {
    stage.zero_grads();
    volatile double norm = grad_sq_sum(stage.params(), SlabView{stage.grads().data(), false}, whole);
    (void)norm;
    opt.step(stage.params(), stage.weights(), stage.grads(), 1e-4, 1.f);
  });
  return t / static_cast<double>(stage.weights().size());
}

// Half the round trip of `bytes` between ranks 0 and 1 (the others wait).
std::vector<MachineCosts::Transfer> time_messages(World& world, const std::vector<size_t>& sizes) {
  Comm comm(world, Topology::of(world.rank(), world.size(), 1), WaitPolicy::automatic, 120);
  std::vector<MachineCosts::Transfer> out;
  for (size_t bytes : sizes) {
    std::vector<float> buf(bytes / sizeof(float), 1.f);
    const int me = world.rank();
    auto trip = [&] {
      if (me > 1) return;
      Request r = me == 0 ? comm.isend(buf.data(), buf.size(), 1, 7) : comm.irecv(buf.data(), buf.size(), 0, 7);
      comm.wait(r, {"calibration message"});
      r = me == 0 ? comm.irecv(buf.data(), buf.size(), 1, 8) : comm.isend(buf.data(), buf.size(), 0, 8);
      comm.wait(r, {"calibration message"});
    };
    out.push_back({static_cast<double>(bytes), median_seconds([] {}, trip) / 2});
  }
  return out;
}

// One collective over every rank by size: `median(comm, bytes)` is this rank's median seconds of
// it. Every rank's view of the same collective is averaged: the slowest is what a step waits for.
template <class F>
std::vector<MachineCosts::Transfer> time_collectives(World& world, const std::vector<size_t>& sizes, F median) {
  Comm comm(world, Topology::of(world.rank(), 1, world.size()), WaitPolicy::automatic, 120);
  std::vector<MachineCosts::Transfer> out;
  for (size_t bytes : sizes) {
    double sum = median(comm, bytes);
    comm.allreduce_world(&sum, 1);
    out.push_back({static_cast<double>(bytes), sum / world.size()});
  }
  return out;
}

std::vector<MachineCosts::Transfer> time_allreduces(World& world, const std::vector<size_t>& sizes) {
  return time_collectives(world, sizes, [](Comm& comm, size_t bytes) {
    std::vector<float> buf(bytes / sizeof(float), 1.f);
    return median_seconds([] {},
                          [&] {
                            Request r = comm.iallreduce_data(buf.data(), buf.size());
                            comm.wait(r, {"calibration all-reduce"});
                          });
  });
}

// ZeRO-3's layer gather on a CPU (MachineCosts::gather_refill): blocking, into a buffer that stays
// in memory (LayerGather's slot, free again after the pass before), the rank's own slab copied in
// from its master copy as LayerGather does.
std::vector<MachineCosts::Transfer> time_refills(World& world, const std::vector<size_t>& sizes) {
  const int D = world.size(), me = world.rank();
  return time_collectives(world, sizes, [&](Comm& comm, size_t bytes) {
    std::vector<float> buf(bytes / sizeof(float), 1.f);
    std::vector<int> counts(D), offsets(D);
    for (int r = 0; r < D; ++r) {  // slabs in rank order, the last taking the remainder
      offsets[r] = static_cast<int>(buf.size() / D * r);
      counts[r] = static_cast<int>(r + 1 < D ? buf.size() / D : buf.size() - offsets[r]);
    }
    const std::vector<float> mine(counts[me], 1.f);
    return median_seconds([] {},
                          [&] {
                            Request r = comm.iallgather_data(buf.data(), counts, offsets, mine.data());
                            comm.wait(r, {"calibration all-gather"});
                          });
  });
}

}  // namespace

MachineCosts calibrate(const RunSpec& spec, World& world) {
  MachineCosts c = MachineCosts::for_model(spec);
  world.require_agreed(
      [&] { use_spec_device(spec, world.local_rank(), world.local_ranks()); });  // measured where training will run
  const int threads = spec.parallel.threads_per_rank > 0 ? spec.parallel.threads_per_rank : world.cores_per_rank();
  set_blas_threads(threads);
  set_parallel_threads(threads);
  Comm all(world, Topology::of(world.rank(), 1, world.size()), WaitPolicy::automatic, 600);
  const Together together = [&] {
    if (world.size() > 1) all.barrier();
  };
  std::vector<int> sizes;
  for (int b = 1; b <= spec.train.global_batch && (b == 1 || b * spec.model.seq_len <= 16384); b *= 2)
    sizes.push_back(b);
  auto parts_of = [](MachineCosts::AtSize& at) {
    return std::array<PassCosts*, 5>{&at.block, &at.embed, &at.head, &at.block_recompute[0], &at.block_recompute[1]};
  };
  // v[size][field][sweep]: the 15 figures of each size, as measured in each sweep.
  std::vector<std::vector<std::vector<double>>> v(sizes.size(), std::vector<std::vector<double>>(15));
  for (int sweep = 0; sweep < kSweeps; ++sweep)
    for (size_t i = 0; i < sizes.size(); ++i) {
      const RunSpec s = one_block_spec(spec, sizes[i]);
      MachineCosts::AtSize at;
      at.block = time_stage(together, s, 1);
      at.embed = minus(time_stage(together, s, 0), at.block);
      at.head = minus(time_stage(together, s, 2), at.block);
      at.block_recompute[0] = time_recompute(together, s, Recompute::block);
      at.block_recompute[1] = time_recompute(together, s, Recompute::stage);
      // The mean over ranks that measured at the same time.
      std::vector<double> mean;
      for (PassCosts* p : parts_of(at)) mean.insert(mean.end(), {p->f, p->b, p->w});
      all.allreduce_world(mean.data(), mean.size());
      for (size_t k = 0; k < mean.size(); ++k) v[i][k].push_back(mean[k] / world.size());
    }
  for (size_t i = 0; i < sizes.size(); ++i) {
    MachineCosts::AtSize at;
    at.samples = sizes[i];
    const auto parts = parts_of(at);
    for (size_t k = 0; k < parts.size(); ++k)
      *parts[k] = {median(v[i][3 * k]), median(v[i][3 * k + 1]), median(v[i][3 * k + 2])};
    c.compute.push_back(at);
  }
  c.adamw_s_per_param = adamw_s_per_param(together, spec);
  all.allreduce_world(&c.adamw_s_per_param, 1);
  c.adamw_s_per_param /= world.size();
  char what[200];
  std::snprintf(what, sizeof what, "calibrated on %s (%s), %d rank(s) x %d thread(s)", world.hosts().at(0).c_str(),
                compute_device() == Device::gpu ? "GPU" : cpu_model().c_str(), world.size(), threads);
  c.source = what;
  if (world.size() >= 2) {
    std::vector<size_t> sizes;
    for (size_t bytes = 4096; bytes <= (64u << 20); bytes *= 4) sizes.push_back(bytes);
    c.p2p = time_messages(world, sizes);
    c.allreduce = time_allreduces(world, sizes);
    c.allreduce_ranks = world.size();
    if (compute_device() == Device::cpu) c.gather_refill = time_refills(world, sizes);
  }
  return c;
}

}  // namespace pipetrain
