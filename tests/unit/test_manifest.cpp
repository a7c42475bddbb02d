// The checkpoint manifest (ckpt/manifest.hpp): what is written is what is read back, and a
// malformed one is refused naming the file. And how --resume's text is read (ckpt/resume.hpp).
#include <catch2/catch.hpp>

#include "pipetrain/ckpt/manifest.hpp"
#include "pipetrain/ckpt/resume.hpp"
#include "pipetrain/config/spec_schema.hpp"

using namespace pipetrain;

TEST_CASE("manifest: to_json and parse round trip every field", "[manifest][ckpt]") {
  Manifest m;
  m.format = 1;
  m.step = 120;
  m.spec_hash = "00ab";
  m.pp = 2;
  m.dp = 3;
  m.virtual_stages = 2;
  m.spec = {{"model.n_layer", "4"}, {"run.seed", "7"}};
  m.partition = {1, 1, 1, 1};
  m.samples_consumed = 120 * 16;
  m.optimizer_steps = 118;
  m.write_s = 0.25;
  m.shards = {{"stage_000.h5", 1234, 0xfeedbeefcafe, {"wte.weight", "h.0.ln_1.weight"}},
              {"stage_001.h5", 99, 42, {"h.3.mlp.c_proj.bias"}}};
  const Manifest back = Manifest::parse(m.to_json(), "test/manifest.json");
  CHECK(back.format == m.format);
  CHECK(back.step == m.step);
  CHECK(back.spec_hash == m.spec_hash);
  CHECK(back.spec == m.spec);
  CHECK(back.pp == 2);
  CHECK(back.dp == 3);
  CHECK(back.virtual_stages == 2);
  CHECK(back.partition == m.partition);
  CHECK(back.samples_consumed == m.samples_consumed);
  CHECK(back.optimizer_steps == 118);
  CHECK(back.write_s == Approx(0.25));
  REQUIRE(back.shards.size() == 2);
  CHECK(back.shards[0].file == "stage_000.h5");
  CHECK(back.shards[0].bytes == 1234);
  CHECK(back.shards[0].checksum == 0xfeedbeefcafe);
  CHECK(back.shards[0].tensors == m.shards[0].tensors);
  CHECK(back.shards[1].tensors == m.shards[1].tensors);
}

TEST_CASE("manifest: malformed text is a SpecError naming the file", "[manifest][ckpt]") {
  CHECK_THROWS_WITH(Manifest::parse("{not json", "run/checkpoints/step_1/manifest.json"),
                    Catch::Contains("run/checkpoints/step_1/manifest.json"));
  CHECK_THROWS_AS(Manifest::parse("{}", "m.json"), SpecError);
}

TEST_CASE("resume: --resume's text is read once: auto, never, anything else a path", "[ckpt]") {
  CHECK(ResumeFrom().mode == ResumeMode::automatic);  // --resume's default
  CHECK(ResumeFrom::parse("auto").mode == ResumeMode::automatic);
  CHECK(ResumeFrom::parse("never").mode == ResumeMode::never);
  const ResumeFrom named = ResumeFrom::parse("runs/a/checkpoints/step_00000010");
  CHECK(named.mode == ResumeMode::path);
  CHECK(named.path == "runs/a/checkpoints/step_00000010");
  CHECK(ResumeFrom::parse("./auto").mode == ResumeMode::path);  // a folder of that name, spelt as a path
}

TEST_CASE("a checkpoint written before a model key existed holds that key's default", "[manifest][ckpt]") {
  // Checkpoints from before model.arch and the llama keys: a gpt2 run resumes from them, a llama
  // run does not (naming the key).
  const RunSpec gpt2 = load_spec("", {}, 0);
  Manifest old;
  for (const SpecKey& k : spec_schema())
    if (k.dotted() != "model.arch" && k.dotted() != "model.n_kv_head") old.spec[k.dotted()] = k.show(gpt2);
  CHECK(incompatibility(old, gpt2).empty());
  const RunSpec llama = load_spec("", {"model.arch=llama"}, 0);
  CHECK(incompatibility(old, llama).rfind("model.arch differs: checkpoint has \"gpt2\"", 0) == 0);
  Manifest changed = old;
  changed.spec["model.d_model"] = "128";
  CHECK(incompatibility(changed, gpt2) == "model.d_model differs: checkpoint has 128, this run has 64");
}

TEST_CASE("training on from a checkpoint needs its data stream and batch, evaluating it only its model",
          "[manifest][ckpt]") {
  const RunSpec saved = load_spec("", {}, 0);
  Manifest m;
  for (const SpecKey& k : spec_schema()) m.spec[k.dotted()] = k.show(saved);
  for (const char* other : {"data.shuffle=false", "train.global_batch=8", "run.seed=7", "data.document_token=10"}) {
    INFO(other);
    const RunSpec spec = load_spec("", {other}, 0);
    CHECK_FALSE(incompatibility(m, spec).empty());
    CHECK(incompatibility(m, spec, true).empty());
  }
  CHECK_FALSE(incompatibility(m, load_spec("", {"model.n_layer=3"}, 0), true).empty());
}
