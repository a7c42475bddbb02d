// ZeRO-3's LayerGather on two real ranks as two data-parallel replicas (mpiexec -n 2): each keeps
// half of every tensor, and a layer's whole weights appear where the passes read them; resharded,
// the layers of a pass share slots (the memory of two blocks, the embedding's and the head's),
// kept, every layer has its own until the step's end.
#include <catch2/catch.hpp>

#include <numeric>
#include <stdexcept>

#include "pipetrain/config/spec.hpp"
#include "pipetrain/dist/comm.hpp"
#include "pipetrain/train/param_fetch.hpp"
#include "test_world.hpp"

using namespace pipetrain;

namespace {

Comm& replicas() {  // pp 1 x dp 2: the two ranks are one stage's replicas
  static Comm comm(test_world(), Topology::of(test_world().rank(), 1, 2), WaitPolicy::automatic, 60);
  return comm;
}

size_t floats_of(const std::vector<const ParamTensor*>& tensors) {
  size_t n = 0;
  for (const ParamTensor* p : tensors) n += p->size;
  return n;
}

}  // namespace

TEST_CASE("layer gather: every layer's whole weights where the passes read them, in slots that layers share",
          "[param_fetch][zero][mpi]") {
  REQUIRE(test_world().size() == 2);
  const RunSpec spec = parse_spec("", "",
                                  {"parallel.dp=2", "parallel.zero=3", "model.n_layer=4", "model.d_model=16",
                                   "model.n_head=2", "model.tie_embeddings=true"},
                                  2);
  const int L = spec.model.n_layer;
  Trace no_trace;
  for (bool reshard : {true, false}) {
    INFO((reshard ? "resharded after each pass" : "kept for the step"));
    Stage stage(spec, 0, 1, 0, L, spec.parallel.micro_batches, 1.0f);
    stage.init_params(7);
    const std::vector<float> whole = stage.weights().to_host();
    AdamW adam(spec.train, OptimizerShard(stage.params(), test_world().rank(), 2, 3));
    adam.take_weights(stage.weights());
    stage.drop_weights();
    LayerGather gather(replicas(), stage, adam, reshard, nullptr, no_trace);
    stage.set_weight_fetcher(&gather);

    // A forward over the layers, then a backward (which reads no embedding weights).
    std::vector<std::pair<int, WeightFetcher::Pass>> passes;
    for (int l = 0; l <= L + 1; ++l) passes.emplace_back(l, WeightFetcher::Pass::forward);
    for (int l = L + 1; l >= 1; --l) passes.emplace_back(l, WeightFetcher::Pass::backward);
    for (const auto& [layer, pass] : passes) {
      gather.fetch(0, layer, pass);
      for (const ParamTensor* p : stage.layer_params(0, layer)) {
        const float* at = gather.where(p->offset);
        INFO(p->name);
        CHECK(std::equal(at, at + p->size, whole.begin() + static_cast<long>(p->offset)));
      }
      gather.done(0, layer, pass);
    }
    const size_t embedding = floats_of(stage.layer_params(0, 0)), block = floats_of(stage.layer_params(0, 1)),
                 head = floats_of(stage.layer_params(0, L + 1)), wte = stage.find("wte.weight")->size;
    if (reshard) {
      // Blocks take turns in two slots (the one read and the one posted ahead); the head gathers
      // the tied wte again (the embedding's was released).
      CHECK(gather.slot_floats() == embedding + 2 * block + head);
      CHECK_THROWS_AS(gather.where(stage.find("h.0.attn.c_attn.weight")->offset), std::logic_error);
    } else {
      CHECK(gather.slot_floats() == embedding + L * block + head - wte);  // wte stays from the embedding
      CHECK(gather.where(stage.find("h.0.attn.c_attn.weight")->offset) != nullptr);
    }
    gather.release_all();
    CHECK_THROWS_AS(gather.where(stage.find("wte.weight")->offset), std::logic_error);
    const size_t before = gather.slot_floats();
    gather.fetch(0, 0, WeightFetcher::Pass::forward);  // the next step: the same slots again
    CHECK(gather.slot_floats() == before);
    gather.release_all();
  }
}
