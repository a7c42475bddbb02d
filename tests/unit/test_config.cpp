// Run spec: loading, --set overrides, error messages (file:line, did-you-mean), consistency checks,
// and the resolved TOML round trip (docs/design.md and docs/spec-reference.md).
#include <catch2/catch.hpp>

#include <unistd.h>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>

#include "pipetrain/config/spec.hpp"
#include "temp_dir.hpp"

using namespace pipetrain;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// The SpecError message thrown by f, or "<no SpecError>" when nothing (or something else) was thrown.
std::string spec_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const SpecError& e) {
    return e.what();
  }
  return "<no SpecError>";
}

// Loads a spec from TOML text written to <tmp>/file.toml.
RunSpec load_text(const TempDir& tmp, const std::string& text, std::vector<std::string> overrides = {}, int world = 0) {
  return load_spec(tmp.write("file.toml", text), overrides, world);
}

std::string load_error(const TempDir& tmp, const std::string& text, std::vector<std::string> overrides = {},
                       int world = 0) {
  return spec_error([&] { load_text(tmp, text, overrides, world); });
}

}  // namespace

TEST_CASE("empty path loads the built-in defaults", "[config]") {
  RunSpec s = load_spec("", {}, 0);
  RunSpec d;
  CHECK(s.run.name == "tiny");
  CHECK(s.model.n_layer == d.model.n_layer);
  CHECK(s.model.d_model == d.model.d_model);
  CHECK(s.parallel.pp == 1);
  CHECK(s.parallel.partition == Partition::uniform);
  CHECK(s.data.source == DataSource::synthetic);
  CHECK(s.train.lr == Approx(3e-3));
  CHECK(s.origins.empty());
  CHECK(s.origin("model.n_layer") == "(default)");
  CHECK(resolved_toml(s) == resolved_toml(d));
  CHECK(spec_hash(s) == spec_hash(d));
}

TEST_CASE("a spec file sets values and records where", "[config]") {
  TempDir tmp;
  RunSpec s = load_text(tmp,
                        "[run]\nname = \"exp1\"\nseed = 7\n"
                        "[model]\nn_layer = 6\ntie_embeddings = false\n"
                        "[parallel]\npp = 3\nrecompute = \"block\"\npartition = \"balanced\"\n"
                        "[train]\nlr = 0.01\nmin_lr = 1e-4\n");
  CHECK(s.run.name == "exp1");
  CHECK(s.run.seed == 7);
  CHECK(s.model.n_layer == 6);
  CHECK_FALSE(s.model.tie_embeddings);
  CHECK(s.parallel.pp == 3);
  CHECK(s.parallel.recompute == Recompute::block);
  CHECK(s.parallel.partition == Partition::balanced);
  CHECK(s.train.lr == Approx(0.01));
  CHECK(s.train.min_lr == Approx(1e-4));
  CHECK(s.model.d_model == 64);  // untouched keys keep their defaults
  CHECK(s.origin("model.n_layer") == (tmp.dir / "file.toml").string() + ":5");
}

TEST_CASE("set overrides accept ints floats bools bare strings and lists", "[config]") {
  TempDir tmp;
  RunSpec s = load_text(tmp, "[model]\nn_layer = 2\n",
                        {"model.n_layer=4", "train.lr=0.5", "model.tie_embeddings=false", "run.name=foo",
                         "parallel.pp=2", "parallel.partition=[1,3]", "data.shuffle=false"});
  CHECK(s.model.n_layer == 4);  // --set wins over the file
  CHECK(s.train.lr == Approx(0.5));
  CHECK_FALSE(s.model.tie_embeddings);
  CHECK_FALSE(s.data.shuffle);
  CHECK(s.run.name == "foo");
  CHECK(s.parallel.partition == Partition::explicit_list);
  CHECK(s.parallel.blocks_per_stage == std::vector<int>{1, 3});
  CHECK_THAT(s.origin("model.n_layer"), Contains("--set"));
  // Quoted strings work too, and overrides apply without any file.
  RunSpec t = load_spec("", {"run.name=\"bar\"", "train.lr=1"}, 0);
  CHECK(t.run.name == "bar");
  CHECK(t.train.lr == Approx(1.0));  // an integer is accepted for a float key
  // String keys keep the raw text even when it reads as another TOML type.
  CHECK(load_spec("", {"run.name=2024", "data.path=true"}, 0).run.name == "2024");
  CHECK(load_spec("", {"data.path=true"}, 0).data.path == "true");
  // ...but other keys still type-check.
  CHECK_THROWS_AS(load_spec("", {"model.n_layer=four"}, 0), SpecError);
}

// Other trainers' names, as their users type them, with the key of the same meaning; written out
// here from those trainers' own spellings (Hugging Face config.json and TrainingArguments,
// Megatron-LM's arguments, torchtitan's job config, DeepSpeed, nanoGPT), not from pipetrain's table.
TEST_CASE("other trainers' names point at the key of the same meaning", "[config]") {
  const std::pair<const char*, const char*> names[] = {
      {"model.num_hidden_layers", "model.n_layer"},
      {"model.num_layers", "model.n_layer"},
      {"model.n_layers", "model.n_layer"},
      {"model.hidden_size", "model.d_model"},
      {"model.n_embd", "model.d_model"},
      {"model.dim", "model.d_model"},
      {"model.num_attention_heads", "model.n_head"},
      {"model.n_heads", "model.n_head"},
      {"model.num_key_value_heads", "model.n_kv_head"},
      {"model.num_query_groups", "model.n_kv_head"},
      {"model.n_kv_heads", "model.n_kv_head"},
      {"model.max_position_embeddings", "model.seq_len"},
      {"model.n_positions", "model.seq_len"},
      {"model.seq_length", "model.seq_len"},
      {"model.max_seq_len", "model.seq_len"},
      {"model.block_size", "model.seq_len"},
      {"model.vocab_size", "model.vocab"},
      {"model.intermediate_size", "model.ffn_hidden"},
      {"model.ffn_hidden_size", "model.ffn_hidden"},
      {"model.multiple_of", "model.ffn_multiple_of"},
      {"model.rms_norm_eps", "model.norm_eps"},
      {"model.layernorm_epsilon", "model.norm_eps"},
      {"model.rotary_base", "model.rope_theta"},
      {"model.tie_word_embeddings", "model.tie_embeddings"},
      {"model.untie_embeddings_and_output_weights", "model.tie_embeddings: the opposite"},
      {"model.model_type", "model.arch"},
      {"parallel.tensor_parallel_size", "parallel.tp"},
      {"parallel.tensor_model_parallel_size", "parallel.tp"},
      {"parallel.tensor_parallel_degree", "parallel.tp"},
      {"parallel.tp_size", "parallel.tp"},
      {"parallel.pipeline_model_parallel_size", "parallel.pp"},
      {"parallel.pipeline_parallel_degree", "parallel.pp"},
      {"parallel.data_parallel_size", "parallel.dp"},
      {"parallel.data_parallel_replicate_degree", "parallel.dp"},
      {"parallel.num_microbatches", "parallel.micro_batches"},
      {"parallel.gradient_accumulation_steps", "parallel.micro_batches"},
      {"parallel.virtual_pipeline_model_parallel_size", "parallel.virtual_stages"},
      {"parallel.pipeline_parallel_schedule", "parallel.schedule"},
      {"parallel.recompute_granularity", "parallel.recompute"},
      {"parallel.zero_stage", "parallel.zero"},
      {"parallel.use_distributed_optimizer", "parallel.zero"},
      {"train.learning_rate", "train.lr"},
      {"train.lr_warmup_iters", "train.warmup_steps"},
      {"train.adam_beta1", "train.beta1"},
      {"train.adam_beta2", "train.beta2"},
      {"train.max_grad_norm", "train.grad_clip"},
      {"train.clip_grad", "train.grad_clip"},
      {"train.global_batch_size", "train.global_batch"},
      {"run.max_steps", "run.steps"},
      {"run.train_iters", "run.steps"},
      {"checkpoint.save_interval", "checkpoint.every_steps"},
      {"eval.eval_interval", "eval.every_steps"},
      {"eval.eval_iters", "eval.batches"},
      {"log.log_interval", "log.every_steps"},
      {"parallel.expert_model_parallel_size", "parallel.ep"},
      {"parallel.expert_parallel_size", "parallel.ep"}};
  for (const auto& [name, ours] : names) {
    INFO(name);
    const std::string msg = spec_error([&] { load_spec("", {std::string(name) + "=2"}, 0); });
    CHECK_THAT(msg, Contains(std::string("did you mean ") + ours));
  }
  // Names with no key of the same meaning get no suggestion rather than a wrong one: a
  // micro-batch's size is not the count parallel.micro_batches holds, context parallelism is not
  // sequence parallelism.
  for (const char* name : {"parallel.pipeline_parallel_microbatch_size", "parallel.context_parallel_degree",
                           "parallel.micro_batch_size"}) {
    INFO(name);
    CHECK_THAT(spec_error([&] { load_spec("", {std::string(name) + "=2"}, 0); }), !Contains("did you mean"));
  }
  CHECK_THAT(spec_error([&] { load_spec("", {"parallel.micro_batch_size=2"}, 0); }),
             Contains("no such key") && Contains("train.global_batch / (parallel.dp x parallel.micro_batches)"));
}

TEST_CASE("malformed --set is a SpecError", "[config]") {
  for (std::string bad : {"parallel.pp", "pp=2", "=2", ".pp=2", "parallel.=2", "a=b.c"}) {
    INFO(bad);
    CHECK_THAT(spec_error([&] { load_spec("", {bad}, 0); }), Contains("--set"));
  }
}

TEST_CASE("unknown keys and sections name file:line and suggest the right one", "[config]") {
  TempDir tmp;
  const std::string file = (tmp.dir / "file.toml").string();
  SECTION("typo in a key") {
    std::string msg = load_error(tmp, "[model]\nn_layer = 4\n\n[parallel]\nmicro_batch = 2\n");
    CHECK_THAT(msg, Contains(file + ":5"));
    CHECK_THAT(msg, Contains("parallel.micro_batch"));
    CHECK_THAT(msg, Contains("did you mean parallel.micro_batches"));
  }
  SECTION("key in the wrong section") {
    std::string msg = load_error(tmp, "[train]\nmicro_batches = 2\n");
    CHECK_THAT(msg, Contains(file + ":2"));
    CHECK_THAT(msg, Contains("parallel.micro_batches"));
  }
  SECTION("unknown section") {
    std::string msg = load_error(tmp, "[run]\nsteps = 3\n[paralel]\npp = 2\n");
    CHECK_THAT(msg, Contains(file + ":3"));
    CHECK_THAT(msg, Contains("[paralel]"));
    CHECK_THAT(msg, Contains("did you mean [parallel]"));
  }
  SECTION("key above every section header") {
    // A common slip: the key is written before [parallel]. It should still point at the real key.
    std::string msg = load_error(tmp, "micro_batches = 2\n[parallel]\npp = 1\n");
    CHECK_THAT(msg, Contains(file + ":1"));
    CHECK_THAT(msg, Contains("parallel.micro_batches"));
  }
  SECTION("unknown key through --set") {
    std::string msg = spec_error([] { load_spec("", {"parallel.micro_batch=2"}, 0); });
    CHECK_THAT(msg, Contains("--set"));
    CHECK_THAT(msg, Contains("parallel.micro_batches"));
  }
}

TEST_CASE("model.arch = llama: defaults that follow from the shape, and every impossible combination named",
          "[config]") {
  TempDir tmp;
  SECTION("the Llama rules fill in what is not set") {
    const RunSpec s = load_spec("", {"model.arch=llama", "model.d_model=4096", "model.n_head=32"}, 0);
    CHECK(s.model.ffn_hidden == 11008);   // 2/3 x 4 x 4096 = 10922, rounded up to 256: Llama 2 7B's
    CHECK(s.model.n_kv_head == 32);       // multi-head unless set
    CHECK_FALSE(s.model.tie_embeddings);  // untied unless set
    CHECK(load_spec("", {"model.arch=llama", "model.tie_embeddings=true"}, 0).model.tie_embeddings);
    CHECK(load_spec("", {"model.arch=llama", "model.ffn_hidden=100"}, 0).model.ffn_hidden == 100);
    const RunSpec back = load_spec(tmp.write("llama.toml", resolved_toml(s)), {}, 0);  // config.toml reads back
    CHECK(resolved_toml(back) == resolved_toml(s));
  }
  SECTION("a gpt2 spec keeps its meaning and refuses the llama keys") {
    const RunSpec g = load_spec("", {}, 0);
    CHECK(g.model.arch == Arch::gpt2);
    CHECK(g.model.tie_embeddings);
    for (const char* key : {"model.n_kv_head=2", "model.rope_theta=500000", "model.ffn_hidden=128",
                            "model.ffn_multiple_of=64", "model.norm_eps=1e-6", "model.attention_bias=true"}) {
      INFO(key);
      const std::string msg = spec_error([&] { load_spec("", {key}, 0); });
      CHECK_THAT(msg, Contains(std::string(key).substr(0, std::string(key).find('='))));
      CHECK_THAT(msg, Contains("belongs to model.arch = \"llama\""));
    }
  }
  SECTION("key/value heads must divide the query heads; rotary needs an even head size") {
    std::string msg = load_error(tmp, "[model]\narch = \"llama\"\nn_head = 4\nn_kv_head = 3\n");
    CHECK_THAT(msg, Contains(":4"));
    CHECK_THAT(msg, Contains("n_kv_head = 3 does not divide model.n_head = 4"));
    msg = load_error(tmp, "[model]\narch = \"llama\"\nn_head = 2\nn_kv_head = 4\n");
    CHECK_THAT(msg, Contains("model.n_kv_head"));
    msg = load_error(tmp, "[model]\narch = \"llama\"\nd_model = 60\nn_head = 4\n");
    CHECK_THAT(msg, Contains("head_dim = d_model / n_head = 15 is odd"));
  }
}

TEST_CASE("model.moe: a [model.moe] table or --set model.moe.key, and every impossible combination named", "[config]") {
  TempDir tmp;
  const std::string llama = "[model]\narch = \"llama\"\nn_layer = 4\nffn_hidden = 96\n";
  SECTION("a table, a dotted key under [model] and --set all set the same keys") {
    const RunSpec a = load_text(tmp, llama + "[model.moe]\nexperts = 8\ntop_k = 1\n");
    CHECK(a.model.moe.experts == 8);
    CHECK(a.model.moe.top_k == 1);
    CHECK(a.model.moe.ffn_hidden == 96);  // unset: model.ffn_hidden
    CHECK(a.origin("model.moe.experts") == (tmp.dir / "file.toml").string() + ":6");
    const RunSpec b = load_text(tmp, llama + "moe.experts = 8\nmoe.top_k = 1\n");
    CHECK(resolved_toml(b) == resolved_toml(a));
    const RunSpec c = load_text(tmp, llama + "[model.moe]\nexperts = 8\ntop_k = 2\n", {"model.moe.top_k=1"});
    CHECK(resolved_toml(c) == resolved_toml(a));  // --set wins over the table
    CHECK(c.origin("model.moe.top_k") == "--set model.moe.top_k=1");
    const RunSpec back = load_spec(tmp.write("moe.toml", resolved_toml(a)), {}, 0);  // config.toml reads back
    CHECK(resolved_toml(back) == resolved_toml(a));
    CHECK(a.model.moe.block_is_moe(0));
    const RunSpec every = load_text(tmp, llama + "[model.moe]\nexperts = 4\nevery = 2\n");
    CHECK_FALSE(every.model.moe.block_is_moe(0));
    CHECK(every.model.moe.block_is_moe(1));
    CHECK(every.model.moe.block_is_moe(3));
  }
  SECTION("misplaced and misspelled keys point at the right one") {
    CHECK_THAT(load_error(tmp, llama + "experts = 8\n"), Contains("did you mean model.moe.experts?"));
    CHECK_THAT(load_error(tmp, llama + "[model.moe]\nexperts = 8\ntopk = 2\n"),
               Contains("did you mean model.moe.top_k?"));
  }
  SECTION("what a mixture of experts cannot be") {
    const std::pair<std::vector<std::string>, const char*> refused[] = {
        {{"model.moe.top_k=1"}, "model.moe.top_k: belongs to a mixture of experts, and model.moe.experts = 0"},
        {{"model.moe.experts=4", "model.moe.top_k=5"}, "top_k = 5 exceeds model.moe.experts = 4"},
        {{"model.moe.experts=4", "model.moe.every=5"}, "every = 5 makes none of model.n_layer = 4 blocks an MoE block"},
        {{"model.moe.experts=4", "model.moe.ffn_hidden=30", "parallel.tp=4", "model.n_head=4"},
         "tp = 4 does not divide each expert's SwiGLU width 30"},
        {{"parallel.ep=2", "parallel.dp=2"}, "parallel.ep: ep = 2 spreads experts, and model.moe.experts = 0"},
        {{"model.moe.experts=6", "parallel.ep=4", "parallel.dp=4"}, "ep = 4 does not divide model.moe.experts = 6"},
        {{"model.moe.experts=8", "parallel.ep=4", "parallel.dp=2"}, "ep = 4 does not divide parallel.dp = 2"},
    };
    for (const auto& [sets, why] : refused) {
      INFO(why);
      CHECK_THAT(load_error(tmp, llama, sets), Contains(why));
    }
    CHECK_THAT(spec_error([] { load_spec("", {"model.moe.experts=4"}, 0); }),
               Contains("experts are SwiGLU MLPs of the llama family: they need model.arch = \"llama\""));
  }
}

TEST_CASE("a retired key is read past with a note naming where it was set", "[config]") {
  // Run directories and checkpoints written before comm.backend was retired still hold it.
  TempDir tmp;
  const std::string file = tmp.write("old.toml", "[comm]\nbackend = \"mpi\"\ntimeout_s = 30\n");
  const RunSpec spec = load_spec(file, {}, 0);
  CHECK(spec.comm.timeout_s == 30);
  REQUIRE(spec.notes.size() == 1);
  CHECK_THAT(spec.notes[0], Contains(file + ":2"));
  CHECK_THAT(spec.notes[0], Contains("comm.backend is no longer read"));
  CHECK_THAT(resolved_toml(spec), !Contains("backend"));
  CHECK(load_spec("", {}, 0).notes.empty());
}

TEST_CASE("wrong types or ranges or enum values name the key and line", "[config]") {
  TempDir tmp;
  const std::string file = (tmp.dir / "file.toml").string();
  SECTION("wrong type") {
    std::string msg = load_error(tmp, "[model]\nd_model = 64\nn_layer = \"four\"\n");
    CHECK_THAT(msg, Contains(file + ":3"));
    CHECK_THAT(msg, Contains("model.n_layer"));
    CHECK_THAT(msg, Contains("integer"));
  }
  SECTION("out of range") {
    std::string msg = load_error(tmp, "[parallel]\npp = 0\n");
    CHECK_THAT(msg, Contains(file + ":2"));
    CHECK_THAT(msg, Contains("parallel.pp"));
    CHECK_THAT(msg, Contains("range"));
  }
  SECTION("enum typo") {
    std::string msg = load_error(tmp, "[parallel]\n\nrecompute = \"blok\"\n");
    CHECK_THAT(msg, Contains(file + ":3"));
    CHECK_THAT(msg, Contains("parallel.recompute"));
    CHECK_THAT(msg, Contains("did you mean \"block\""));
  }
  SECTION("invalid TOML syntax") {
    std::string msg = load_error(tmp, "[model]\nn_layer = 4\nd_model = = 8\n");
    CHECK_THAT(msg, Contains(file + ":3"));
  }
  SECTION("missing file") {
    CHECK_THAT(spec_error([&] { load_spec((tmp.dir / "nope.toml").string(), {}, 0); }), Contains("nope.toml"));
  }
}

TEST_CASE("inconsistent combinations each name their key", "[config]") {
  TempDir tmp;
  const std::string file = (tmp.dir / "file.toml").string();
  SECTION("pp x dp != world size") {
    std::string msg = load_error(tmp, "[parallel]\npp = 2\ndp = 2\n", {}, 3);
    CHECK_THAT(msg, Contains("parallel.pp"));
    CHECK_THAT(msg, Contains(file + ":2"));
    CHECK_NOTHROW(load_text(tmp, "[parallel]\npp = 2\ndp = 2\n", {}, 4));
  }
  SECTION("global_batch not divisible by dp x micro_batches") {
    std::string msg = load_error(tmp, "[parallel]\ndp = 2\nmicro_batches = 4\n[train]\nglobal_batch = 12\n");
    CHECK_THAT(msg, Contains("train.global_batch"));
    CHECK_THAT(msg, Contains(file + ":5"));
    CHECK_NOTHROW(load_text(tmp, "[parallel]\ndp = 2\nmicro_batches = 4\n[train]\nglobal_batch = 16\n"));
  }
  SECTION("more stages than layers") {
    std::string msg = load_error(tmp, "[model]\nn_layer = 2\n[parallel]\npp = 3\n");
    CHECK_THAT(msg, Contains("parallel.pp"));
    CHECK_THAT(msg, Contains("n_layer"));
  }
  SECTION("n_head does not divide d_model") {
    std::string msg = load_error(tmp, "[model]\nd_model = 64\nn_head = 5\n");
    CHECK_THAT(msg, Contains("model.n_head"));
    CHECK_THAT(msg, Contains(file + ":3"));
  }
  SECTION("explicit partition with the wrong number of stages") {
    std::string msg = load_error(tmp, "[parallel]\npp = 2\npartition = [1, 2, 1]\n");
    CHECK_THAT(msg, Contains("parallel.partition"));
    CHECK_THAT(msg, Contains(file + ":3"));
  }
  SECTION("explicit partition with the wrong sum") {
    std::string msg = load_error(tmp, "[model]\nn_layer = 4\n[parallel]\npp = 2\npartition = [1, 2]\n");
    CHECK_THAT(msg, Contains("parallel.partition"));
    CHECK_THAT(msg, Contains("4"));
  }
  SECTION("text source without a path") {
    std::string msg = load_error(tmp, "[data]\nsource = \"text\"\n");
    CHECK_THAT(msg, Contains("data.path"));
  }
  SECTION("a huge dp x micro_batches does not wrap around") {
    // 2^20 x 4097 = 2^32 + 2^20, which does not divide 2^20 (in 32-bit ints it wraps to 2^20).
    std::string msg = spec_error([] {
      load_spec("", {"parallel.dp=1048576", "parallel.micro_batches=4097", "train.global_batch=1048576"}, 0);
    });
    CHECK_THAT(msg, Contains("train.global_batch"));
  }
  SECTION("validate_spec alone checks the world size") {
    RunSpec s;
    s.parallel.pp = 2;
    s.parallel.dp = 2;
    CHECK_NOTHROW(validate_spec(s, 4));
    CHECK_NOTHROW(validate_spec(s, 0));
    CHECK_THAT(spec_error([&] { validate_spec(s, 2); }), Contains("parallel.pp"));
  }
}

TEST_CASE("resolved_toml round-trips through a file", "[config]") {
  TempDir tmp;
  RunSpec a = load_text(tmp,
                        "[run]\nname = 'say \"hi\" \\\\ there'\nseed = 99\nsteps = 12\n"
                        "[model]\nn_layer = 5\nd_model = 48\nn_head = 6\ntie_embeddings = false\n"
                        "[data]\nshuffle = false\n"
                        "[parallel]\npp = 2\ndp = 2\npartition = [2, 3]\nrecompute = \"stage\"\n"
                        "[train]\nglobal_batch = 8\nlr = 0.0012345678901\nmin_lr = 1e-5\neps = 1e-12\n"
                        "[comm]\ntimeout_s = 2.5\nbucket_mb = 1e6\n");
  const std::string text = resolved_toml(a);
  CHECK_THAT(text, Contains("[parallel]"));
  CHECK_THAT(text, Contains("micro_batches"));  // defaults are written too
  RunSpec b = load_spec(tmp.write("resolved.toml", text), {}, 4);
  CHECK(resolved_toml(b) == text);
  CHECK(spec_hash(b) == spec_hash(a));
  CHECK(b.run.name == a.run.name);
  CHECK(b.run.seed == 99);
  CHECK(b.model.n_head == 6);
  CHECK(b.parallel.blocks_per_stage == std::vector<int>{2, 3});
  CHECK(b.train.lr == a.train.lr);  // exact, not approximate
  CHECK(b.train.eps == a.train.eps);
  CHECK(b.comm.timeout_s == 2.5);
  CHECK(b.comm.bucket_mb == 1e6);
  // Strings with quotes, backslashes, tabs and UTF-8 survive too.
  RunSpec c = load_text(tmp, "[run]\nout_dir = \"it's \\\"q\\\" \\\\ a\\tb \u00e9\"\n[train]\ngrad_clip = 1e30\n");
  CHECK(c.run.out_dir == "it's \"q\" \\ a\tb \u00e9");
  RunSpec c2 = load_spec(tmp.write("resolved2.toml", resolved_toml(c)), {}, 0);
  CHECK(c2.run.out_dir == c.run.out_dir);
  CHECK(c2.train.grad_clip == 1e30);
  CHECK(spec_hash(c2) == spec_hash(c));
  // The defaults round-trip as well.
  RunSpec d = load_spec(tmp.write("defaults.toml", resolved_toml(RunSpec{})), {}, 1);
  CHECK(spec_hash(d) == spec_hash(RunSpec{}));
}

TEST_CASE("spec_hash changes when any one key changes", "[config]") {
  const RunSpec base = load_spec("", {}, 0);
  const uint64_t h = spec_hash(base);
  CHECK(spec_hash(load_spec("", {}, 0)) == h);
  for (std::string o : {"run.seed=1235", "model.n_layer=8", "train.lr=0.002", "data.shuffle=false", "run.name=tinz",
                        "parallel.recompute=stage", "parallel.partition=balanced", "comm.bucket_mb=8"}) {
    INFO(o);
    CHECK(spec_hash(load_spec("", {o}, 0)) != h);
  }
}

TEST_CASE("resolved_toml escapes every control character TOML forbids", "[config]") {
  TempDir tmp;
  RunSpec s;
  s.run.out_dir = std::string("a\x01") + "b\x1f" + "c\x7f" + "d";  // U+0001, U+001F, U+007F (DEL)
  RunSpec t = load_spec(tmp.write("resolved.toml", resolved_toml(s)), {}, 0);
  CHECK(t.run.out_dir == s.run.out_dir);
}

TEST_CASE("a command-line choice is parsed once, naming the value and what is allowed", "[config]") {
  CHECK(parse_choice("data import: --format", "megatron", {CorpusFormat::llmc, CorpusFormat::megatron}) ==
        CorpusFormat::megatron);
  try {
    parse_choice("data export: --format", "nanogpt", {CorpusFormat::llmc, CorpusFormat::megatron});
    FAIL("nanogpt is not an export format");
  } catch (const SpecError& e) {
    CHECK(std::string(e.what()) == "data export: --format nanogpt is not one of llmc | megatron");
  }
  CHECK_THROWS_AS(parse_choice("export: --dtype", "fp16", {Dtype::fp32, Dtype::bf16}), SpecError);
}
