// The planner held to the model: over a grid of model family x recompute x tensor parallelism x
// sequence parallelism x schedule, a real Stage per rank (tensor ranks as threads of one process)
// runs its stage's whole action list, and what it allocates, sends its tensor group and computes
// (its own counters: buffer sizes, messages_sent, the kernels' FLOP counters) equals what the
// planner predicts from the layer declarations (model/layer_decl.hpp), to the byte.
#include <catch2/catch.hpp>
#include <random>
#include <sstream>

#include "pipetrain/compute/profile.hpp"
#include "pipetrain/model/layer_decl.hpp"
#include "pipetrain/model/model.hpp"
#include "pipetrain/planner/plan.hpp"
#include "pipetrain/planner/step_time.hpp"
#include "pipetrain/schedule/registry.hpp"
#include "thread_tensor_group.hpp"

using namespace pipetrain;

namespace {

// What one rank of one stage did over a step.
struct Measured {
  size_t params = 0, act_peak = 0, scratch_peak = 0;
  double model_flops = 0;
  std::vector<std::string> mismatches;  // per pass: what differed from its declaration
};

std::string describe(const Messages& m) {
  std::ostringstream os;
  const char* names[kExchanges] = {"gather", "sum", "max", "stats", "route"};
  for (int k = 0; k < kExchanges; ++k) os << names[k] << " " << m[k].calls << " calls " << m[k].bytes << " B; ";
  return os.str();
}

Messages minus(Messages a, const Messages& b) {
  add(a, b, -1);
  return a;
}

Measured run_stage(const RunSpec& spec, int stage, int rank, TensorGroup* group) {
  const ChunkPlacement place = spec.chunk_placement();
  const int n_virtual = place.virtual_stages(), M = spec.parallel.micro_batches;
  const std::vector<ChunkRange> chunks = chunks_of(partition_blocks(spec), place, stage);
  Stage st(spec, chunks, n_virtual, M, 0.01f, TpPart{rank, spec.parallel.tp});
  if (group) st.set_tensor_group(group);
  st.init_params(3);
  st.zero_grads();
  Measured out;
  for (const ParamTensor& p : st.params()) out.params += p.size;
  const size_t rows = static_cast<size_t>(spec.samples_per_micro_batch()) * spec.model.seq_len;
  std::mt19937 gen(7 + stage);
  std::vector<int> tokens(rows);
  std::vector<float> act(st.boundary_floats()), grad(st.boundary_floats()), sink(st.boundary_floats());
  for (auto& t : tokens) t = static_cast<int>(gen() % spec.model.vocab);
  for (auto& x : act) x = std::uniform_real_distribution<float>(-1, 1)(gen);
  for (auto& x : grad) x = std::uniform_real_distribution<float>(-1e-3f, 1e-3f)(gen);
  take_kernel_totals();
  for (const Action& a : spec.parallel.schedule->generate(stage, spec.pipeline_shape())) {
    const ChunkRange& c = chunks[a.chunk];
    const bool first = c.vstage == 0, last = c.vstage == n_virtual - 1;
    const Messages before = st.messages_sent();
    ChunkPass pass;
    if (a.op == Op::forward) {
      if (first) st.set_tokens(a.mb, tokens.data());
      else std::copy(act.begin(), act.end(), st.input_buffer(a.chunk, a.mb));
      if (last) st.set_targets(a.mb, tokens.data());
      st.forward(a.chunk, a.mb, sink.data());
      pass = ChunkPass::forward;
    } else if (a.op == Op::backward) {
      st.backward(a.chunk, a.mb, grad.data(), sink.data());
      pass = ChunkPass::backward;
    } else if (a.op == Op::backward_input) {
      st.backward_input(a.chunk, a.mb, grad.data(), sink.data());
      pass = ChunkPass::backward_input;
    } else if (a.op == Op::backward_weight) {
      st.backward_weight(a.chunk, a.mb);
      pass = ChunkPass::backward_weight;
    } else {
      continue;  // messages between stages: the executor's, not the Stage's
    }
    const BlockSpan blocks{c.block_begin, c.block_end};
    const KernelTotals counted = take_kernel_totals();
    const PassFlops flops = chunk_flops(spec, blocks, first, last, pass);
    const Messages sent = minus(st.messages_sent(), before), declared = chunk_messages(spec, blocks, first, last, pass);
    std::ostringstream what;
    what << "stage " << stage << " rank " << rank << " op " << static_cast<int>(a.op) << " chunk " << a.chunk << " mb "
         << a.mb << ": ";
    if (counted.gemm_flops != flops.gemm || counted.attention_flops != flops.attention)
      out.mismatches.push_back(what.str() + "FLOPs counted " + std::to_string(counted.gemm_flops) + " + " +
                               std::to_string(counted.attention_flops) + ", declared " + std::to_string(flops.gemm) +
                               " + " + std::to_string(flops.attention));
    if (sent != declared)
      out.mismatches.push_back(what.str() + "sent " + describe(sent) + "declared " + describe(declared));
    out.model_flops += counted.gemm_flops + counted.attention_flops;
    size_t live = 0;
    for (int chunk = 0; chunk < st.chunks(); ++chunk)
      for (int mb = 0; mb < M; ++mb) live += st.stash_bytes(chunk, mb);
    out.act_peak = std::max(out.act_peak, live);
    out.scratch_peak = std::max(out.scratch_peak, st.scratch_bytes());
  }
  return out;
}

// The grid's spec, or nothing where validation refuses the combination.
std::optional<RunSpec> grid_spec(const std::vector<std::string>& overrides, int world) {
  try {
    return parse_spec("", "", overrides, world);
  } catch (const SpecError&) {
    return std::nullopt;
  }
}

}  // namespace

TEST_CASE("the planner's bytes, messages and FLOPs equal what real Stages allocate, send and count",
          "[planner_model]") {
  int combinations = 0;
  for (const char* family : {"gpt2", "llama", "moe"})
    for (const char* recompute : {"none", "stage", "block"})
      for (int tp : {1, 2})
        for (bool sp : {false, true})
          for (const char* schedule : {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipev"}) {
            if (sp && tp == 1) continue;
            const bool moe = std::string(family) == "moe";  // llama with MoE blocks 1 and 3, shared experts
            std::vector<std::string> overrides = {std::string("model.arch=") + (moe ? "llama" : family),
                                                  "model.n_layer=4",
                                                  "model.d_model=16",
                                                  "model.n_head=4",
                                                  "model.seq_len=8",
                                                  "model.vocab=128",
                                                  "train.global_batch=8",
                                                  "parallel.pp=2",
                                                  "parallel.dp=1",
                                                  "parallel.tp=" + std::to_string(tp),
                                                  std::string("parallel.sequence_parallel=") + (sp ? "true" : "false"),
                                                  std::string("parallel.schedule=") + schedule,
                                                  std::string("parallel.recompute=") + recompute,
                                                  "parallel.micro_batches=4"};
            if (std::string(family) != "gpt2") {
              overrides.push_back("model.n_kv_head=2");            // grouped heads
              if (moe) overrides.push_back("model.qk_norm=true");  // q and k norms' buffers and sums (OLMoE's)
            }
            if (moe)
              for (const char* key :
                   {"model.moe.experts=4", "model.moe.top_k=2", "model.moe.ffn_hidden=24", "model.moe.shared_experts=1",
                    "model.moe.every=2", "model.moe.shared_gate=true", "model.moe.shared_ffn_hidden=32"})
                overrides.push_back(key);
            if (std::string(schedule) == "interleaved") overrides.push_back("parallel.virtual_stages=2");
            const std::optional<RunSpec> spec = grid_spec(overrides, 2 * tp);
            if (!spec) continue;
            ++combinations;
            const Plan plan = make_plan(*spec);
            const int mode = static_cast<int>(spec->parallel.recompute);
            double step_flops = 0;
            for (int stage = 0; stage < spec->parallel.pp; ++stage) {
              std::vector<Measured> ranks(tp);
              testing::run_tensor_ranks(
                  tp, [&](int rank, TensorGroup* group) { ranks[rank] = run_stage(*spec, stage, rank, group); });
              const StagePlan& predicted = plan.stages[stage];
              const std::vector<ChunkRange> chunks = chunks_of(partition_blocks(*spec), spec->chunk_placement(), stage);
              for (int rank = 0; rank < tp; ++rank) {
                const Measured& m = ranks[rank];
                INFO(family << " recompute " << recompute << " tp " << tp << (sp ? " sp" : "") << " " << schedule
                            << " stage " << stage << " rank " << rank);
                CHECK(m.mismatches.empty());
                for (const std::string& s : m.mismatches) UNSCOPED_INFO(s);
                CHECK(m.params == predicted.params);
                CHECK(m.act_peak == predicted.act_peak_bytes[mode]);
                CHECK(m.scratch_peak == stage_scratch_bytes(*spec, chunks, spec->chunk_placement().virtual_stages()));
                step_flops += m.model_flops;
              }
            }
            // The whole step's FLOPs, as the planner's step prediction and (without recompute) the
            // MFU numerator count them.
            INFO(family << " recompute " << recompute << " tp " << tp << (sp ? " sp" : "") << " " << schedule);
            CHECK(step_flops ==
                  Approx(predict_step(*spec, MachineCosts::from_peak(*spec, 1e12, 0.5, 1e9)).flops).epsilon(1e-12));
            // Each tensor rank runs an MoE block's router and shared-expert gate whole (forward and
            // both backward products): the model's FLOPs count them once.
            const double tokens = spec->train.global_batch * spec->model.seq_len;
            // 2 MoE blocks, C 16, E 4 and the gate's 1
            const double replicated = moe ? (tp - 1) * 3 * 2.0 * 16 * (4 + 1) * 2 * tokens : 0;
            if (spec->parallel.recompute == Recompute::none)
              CHECK(step_flops == Approx(training_flops_per_token(*spec) * tokens + replicated).epsilon(1e-12));
          }
  // Every schedule with recompute none; the three that split the backward refuse stage and block.
  CHECK(combinations == 3 * 3 * (6 + 2 * 3));
}

TEST_CASE("under bf16 on the CPU the plan counts the products' copy of the rank's weights, unless ZeRO-3 drops them",
          "[planner_model]") {
  const std::vector<std::string> base = {"model.n_layer=4", "model.d_model=16",     "model.n_head=4",
                                         "model.seq_len=8", "train.global_batch=8", "parallel.pp=2"};
  auto plan_of = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), base.begin(), base.end());
    const RunSpec spec = parse_spec("", "", extra, 4);
    return make_plan(spec);
  };
  const Plan fp32 = plan_of({"parallel.dp=2"}), bf16 = plan_of({"parallel.dp=2", "model.dtype=bf16"});
  const Plan zero3 = plan_of({"parallel.dp=2", "parallel.zero=3"}),
             zero3_bf16 = plan_of({"parallel.dp=2", "parallel.zero=3", "model.dtype=bf16"});
  for (int s = 0; s < 2; ++s) {
    // bf16 adds the operands' scratch slots under either ZeRO level, and the weights' copy below ZeRO-3
    const size_t slots = zero3_bf16.stages[s].working_bytes - zero3.stages[s].working_bytes;
    CHECK(slots > 0);
    CHECK(bf16.stages[s].params == fp32.stages[s].params);
    CHECK(bf16.stages[s].working_bytes - fp32.stages[s].working_bytes == slots + 2 * fp32.stages[s].params);
  }
}
