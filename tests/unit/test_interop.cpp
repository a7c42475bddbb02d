// The model file formats (interop/): bf16 rounding and fp16 decoding bit for bit, safetensors and
// llm.c files read back as written, malformed ones refused naming the file, and the name/layout
// map pinned to llm.c's order and Hugging Face's names.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <limits>

#include "pipetrain/interop/gpt2_layout.hpp"
#include "pipetrain/interop/llmc_model.hpp"
#include "pipetrain/interop/safetensors.hpp"
#include "pipetrain/util/errors.hpp"
#include "pipetrain/util/files.hpp"
#include "temp_dir.hpp"

using namespace pipetrain;

TEST_CASE("bf16: round to nearest, ties to even", "[interop]") {
  CHECK(bf16_from_float(1.0f) == 0x3f80);
  CHECK(bf16_from_float(1.0f + 0x1p-8f) == 0x3f80);                // halfway, 1.0 is even: down
  CHECK(bf16_from_float(1.0f + 0x1p-7f + 0x1p-8f) == 0x3f82);      // halfway, 1 + 2^-7 is odd: up
  CHECK(bf16_from_float(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81);     // above halfway: up
  CHECK(bf16_from_float(-(1.0f + 0x1p-8f + 0x1p-20f)) == 0xbf81);  // the sign rides along
  CHECK(bf16_from_float(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(bf16_from_float(std::numeric_limits<float>::max()) == 0x7f80);  // rounds past bf16's largest
  CHECK(std::isnan(float_from_bf16(bf16_from_float(std::nanf("")))));
  CHECK(std::isnan(float_from_bf16(bf16_from_float(float_of_bits(0x7f800001u)))));  // a NaN whose payload rounds away
  CHECK(float_from_bf16(0x4049) == 3.140625f);
}

TEST_CASE("fp16: normal, subnormal and special values decode exactly", "[interop]") {
  CHECK(float_from_f16(0x3c00) == 1.0f);
  CHECK(float_from_f16(0xc000) == -2.0f);
  CHECK(float_from_f16(0x7bff) == 65504.0f);
  CHECK(float_from_f16(0x0001) == 0x1p-24f);
  CHECK(float_from_f16(0x8000) == 0.0f);
  CHECK(std::signbit(float_from_f16(0x8000)));
  CHECK(std::isinf(float_from_f16(0x7c00)));
  CHECK(std::isnan(float_from_f16(0x7e00)));
}

namespace {

std::vector<float> ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * (static_cast<float>(i) - n / 3.f) + 0x1p-12f * (i % 7);
  return v;
}

std::string write_file(const std::string& path, const std::function<void(BinaryWriter&)>& body) {
  BinaryWriter out(path);
  body(out);
  out.close();
  return path;
}

}  // namespace

TEST_CASE("safetensors: write then read gives the names, shapes and values", "[interop]") {
  TempDir tmp;
  const std::vector<float> a = ramp(6 * 5, 0.37f), b = ramp(7, -1.1f);
  const std::vector<SafetensorsTensor> tensors = {
      {"x.weight", {6, 5}, [&](float* out) { std::copy(a.begin(), a.end(), out); }},
      {"x.bias", {7}, [&](float* out) { std::copy(b.begin(), b.end(), out); }}};
  for (StoredFloat dtype : {StoredFloat::f32, StoredFloat::bf16}) {
    const std::string path = write_file((tmp.dir / "m.safetensors").string(), [&](BinaryWriter& w) {
      write_safetensors(w, tensors, dtype, {{"format", "pt"}});
    });
    const std::string header = safetensors_header(tensors, dtype, {{"format", "pt"}});
    CHECK(header.size() % 8 == 0);
    CHECK(std::filesystem::file_size(path) == header.size() + (30 + 7) * stored_bytes(dtype));
    REQUIRE(SafetensorsFile::looks_like(path));
    SafetensorsFile f(path);
    REQUIRE(f.entries().size() == 2);
    const SafetensorsEntry* w = f.find("x.weight");
    const SafetensorsEntry* bias = f.find("x.bias");
    REQUIRE(w);
    REQUIRE(bias);
    CHECK(w->shape == std::vector<int64_t>{6, 5});
    CHECK(w->dtype == (dtype == StoredFloat::f32 ? "F32" : "BF16"));
    CHECK(w->begin == 0);
    CHECK(bias->begin == w->end);  // packed in the order given, without gaps
    std::vector<float> got(30);
    f.read(*w, got.data());
    for (size_t i = 0; i < a.size(); ++i)
      CHECK(got[i] == (dtype == StoredFloat::f32 ? a[i] : float_from_bf16(bf16_from_float(a[i]))));
  }
}

TEST_CASE("safetensors: a malformed file is refused naming it", "[interop]") {
  TempDir tmp;
  const std::string good = safetensors_header({{"t", {2}, nullptr}}, StoredFloat::f32, {}) + std::string(8, '\0');
  const std::string truncated = tmp.write("short.safetensors", good.substr(0, good.size() - 4));
  CHECK_THROWS_WITH(SafetensorsFile(truncated),
                    Catch::Contains("short.safetensors") && Catch::Contains("data_offsets"));
  std::string huge = good;
  huge[5] = 1;  // header length beyond the file
  CHECK_THROWS_AS(SafetensorsFile(tmp.write("huge.safetensors", huge)), SpecError);
  CHECK_THROWS_AS(SafetensorsFile(tmp.write("tiny.safetensors", "abc")), SpecError);
  CHECK_FALSE(SafetensorsFile::looks_like(tmp.write("text.txt", "hello, this is not a model file")));
}

TEST_CASE("llm.c file: header, padded token table, and the tensors back as written", "[interop]") {
  TempDir tmp;
  LlmcHeader h;
  h.max_seq_len = 8;
  h.vocab = 200;
  h.n_layer = 2;
  h.n_head = 2;
  h.channels = 4;
  h.padded_vocab = llmc_padded_vocab(h.vocab);
  CHECK(h.padded_vocab == 256);
  CHECK(llmc_padded_vocab(256) == 256);
  CHECK(llmc_padded_vocab(50257) == 50304);
  const std::string path = write_file((tmp.dir / "m.bin").string(), [&](BinaryWriter& w) {
    write_llmc(w, h, [](const std::string& name, float* out) {
      const size_t n = name == "wte.weight" ? 200 * 4 : name == "wpe.weight" ? 8 * 4 : 4;
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(name.size()) + 0.5f * i;
    });
  });
  // V x C + the 56 padding rows, T x C, per block 12 C^2 + 13 C, ln_f
  const size_t params = 256 * 4 + 8 * 4 + 2 * (12 * 16 + 13 * 4) + 2 * 4;
  CHECK(std::filesystem::file_size(path) == 1024 + 4 * params);
  REQUIRE(LlmcFile::looks_like(path));
  LlmcFile f(path);
  CHECK(f.header().n_layer == 2);
  CHECK(f.header().padded_vocab == 256);
  CHECK(*f.shape("wte.weight") == std::vector<int64_t>{200, 4});  // the padding is not the model's
  CHECK(*f.shape("h.1.attn.c_attn.weight") == std::vector<int64_t>{12, 4});
  CHECK_FALSE(f.shape("lm_head.weight"));
  CHECK_FALSE(f.shape("h.2.ln_1.weight"));
  std::vector<float> wte(200 * 4);
  f.read("wte.weight", wte.data());
  CHECK(wte[0] == 10.f);
  CHECK(wte[799] == 10.f + 0.5f * 799);
  std::vector<float> lnf(4);
  f.read("ln_f.bias", lnf.data());
  CHECK(lnf[3] == 9.f + 1.5f);

  const std::string bytes = read_input_file(path, "test");
  CHECK_THROWS_WITH(LlmcFile(tmp.write("cut.bin", bytes.substr(0, bytes.size() - 4))),
                    Catch::Contains("cut.bin") && Catch::Contains("header describes"));
}

TEST_CASE("GPT-2 layout: llm.c's tensor order, Hugging Face's names and Conv1D matrices", "[interop]") {
  // llm.c's train_gpt2.c fill_in_parameter_sizes: wte, wpe, ln1w, ln1b, qkvw, qkvb, attprojw,
  // attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb (each for all layers), lnfw, lnfb.
  std::vector<std::string> want = {"wte.weight", "wpe.weight"};
  for (const char* t :
       {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
        "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"})
    for (int i = 0; i < 2; ++i) want.push_back("h." + std::to_string(i) + "." + t);
  want.push_back("ln_f.weight");
  want.push_back("ln_f.bias");
  CHECK(llmc_order(2) == want);

  CHECK(hf_name("h.3.attn.c_attn.weight") == "transformer.h.3.attn.c_attn.weight");
  CHECK(hf_name("lm_head.weight") == "lm_head.weight");
  CHECK(name_from_hf("transformer.wte.weight") == "wte.weight");
  CHECK(name_from_hf("h.0.mlp.c_fc.bias") == "h.0.mlp.c_fc.bias");  // GPT2Model's names, without the prefix
  CHECK(name_from_hf("transformer.h.0.attn.bias") == "");           // a mask buffer, not a parameter
  CHECK(name_from_hf("lm_head.weight") == "lm_head.weight");
  for (const char* conv :
       {"h.0.attn.c_attn.weight", "h.0.attn.c_proj.weight", "h.0.mlp.c_fc.weight", "h.0.mlp.c_proj.weight"})
    CHECK(hf_transposed(conv));
  for (const char* plain : {"wte.weight", "wpe.weight", "lm_head.weight", "h.0.attn.c_attn.bias", "h.0.ln_1.weight"})
    CHECK_FALSE(hf_transposed(plain));

  const float m[6] = {1, 2, 3, 4, 5, 6};  // [2, 3]
  float t[6];
  transpose(m, 2, 3, t);
  CHECK(std::vector<float>(t, t + 6) == std::vector<float>{1, 4, 2, 5, 3, 6});
}
