#include "pipetrain/interop/model_import.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "pipetrain/config/spec_schema.hpp"
#include "pipetrain/interop/hf_family.hpp"
#include "pipetrain/model/block_tensors.hpp"
#include "pipetrain/util/binary_file.hpp"

namespace pipetrain {

namespace {

bool same_value(const std::string& a, const std::string& b) {
  char *end_a = nullptr, *end_b = nullptr;
  const double x = std::strtod(a.c_str(), &end_a), y = std::strtod(b.c_str(), &end_b);
  if (a.empty() || b.empty() || *end_a || *end_b) return a == b;  // not both numbers
  return std::abs(x - y) <= 1e-9 * std::max(std::abs(x), std::abs(y));
}

// The first key the spec sets otherwise than the source declares, the family first: "" when they
// agree. The head's tying is the caller's (a tied source may feed an untied spec).
std::string declared_mismatch(const WeightsSource& src, const RunSpec& spec) {
  // A declared model.arch ("\"llama\"") as Hugging Face names the family.
  auto family_name = [](const std::string& quoted) {
    const std::string arch = quoted.size() > 2 ? quoted.substr(1, quoted.size() - 2) : quoted;
    const auto a = choice_named<Arch>(arch);
    return a ? std::string(hf_family(*a).name) : arch;
  };
  for (const DeclaredKey& d : src.declared()) {
    if (d.key == "model.tie_embeddings") continue;
    const SpecKey* k = find_spec_key(d.key);
    const std::string ours = k->show(spec);
    if (same_value(ours, d.value)) continue;
    if (d.key == "model.arch")
      return "the source is a " + family_name(d.value) + " model (" + d.theirs + "), model.arch = " + ours + " (" +
             spec.origin(d.key) + "): leave model.arch unset to take the source's family";
    return "the source's " + d.theirs + " is " + d.value + ", " + d.key + " = " + ours + " (" + spec.origin(d.key) +
           "): leave " + d.key + " unset to take the source's";
  }
  return "";
}

}  // namespace

ModelImport::ModelImport(const std::string& path, const RunSpec& spec) {
  const std::string where = spec.origin("train.init_from") + ": train.init_from = \"" + path + "\": ";
  source_ = open_source(path, spec);
  const WeightsSource& src = *source_;
  const int L = spec.model.n_layer, T = spec.model.seq_len;
  if (const std::string differs = declared_mismatch(src, spec); !differs.empty()) throw SpecError(where + differs);
  const bool source_tied = !src.shape("lm_head.weight");
  if (spec.model.tie_embeddings && !source_tied)
    throw SpecError(where + "the source has its own lm_head.weight (" + src.own_name("lm_head.weight") +
                    ") but model.tie_embeddings = true (" + spec.origin("model.tie_embeddings") +
                    "): its head would be lost (leave model.tie_embeddings unset, or set it to false, to keep it)");
  head_from_wte_ = !spec.model.tie_embeddings && source_tied;
  const std::string past_last = block_tensor_name(L, block_tensors(spec.model.arch).front());
  if (auto extra = src.shape(past_last))
    throw SpecError(where + "tensor " + past_last + ": the spec expects none (model.n_layer = " + std::to_string(L) +
                    "), the source holds " + shape_text(*extra) + ": it has more blocks");

  size_t count = 0;
  std::vector<std::string> notes;
  for (const ParamTensor& p : stage_params(spec, 0, 1, 0, L)) {
    const std::vector<int64_t> want(p.shape.begin(), p.shape.end());
    const std::string from = source_of(p.name);
    const auto held = src.shape(from);
    const std::string tensor = "tensor " + src.own_name(from) + (from == p.name ? "" : " (for " + p.name + ")");
    if (!held)
      throw SpecError(
          where + tensor + ": the spec expects " + shape_text(want) + ", the source has no such tensor" +
          (p.name.rfind("h.", 0) == 0 ? " (fewer blocks than model.n_layer = " + std::to_string(L) + "?)" : ""));
    const bool longer_positions =
        p.name == "wpe.weight" && held->size() == 2 && (*held)[1] == want[1] && (*held)[0] > want[0];
    if (*held != want && !longer_positions)
      throw SpecError(where + tensor + ": the spec expects " + shape_text(want) + ", the source holds " +
                      shape_text(*held));
    if (longer_positions)
      notes.push_back("wpe.weight: the first " + std::to_string(T) + " of its " + std::to_string((*held)[0]) +
                      " positions (model.seq_len = " + std::to_string(T) + ")");
    count += p.size;
  }
  if (head_from_wte_) notes.push_back("lm_head.weight = a copy of wte.weight (the source ties its head)");
  char params[32];
  std::snprintf(params, sizeof params, "%.2fM", count / 1e6);
  description_ =
      "initialised from " + path + " (" + src.kind() + "): " + params + " parameters, " + std::to_string(L) + " blocks";
  for (auto& n : notes) description_ += "; " + n;
  description_ += "; step 0, fresh optimizer state";
}

std::unique_ptr<WeightsSource> ModelImport::open_source(const std::string& path, const RunSpec& spec) {
  try {
    return WeightsSource::open(path);
  } catch (const SpecError& e) {  // names the path already
    throw SpecError(spec.origin("train.init_from") + ": train.init_from: " + e.what());
  }
}

std::string ModelImport::source_of(const std::string& name) const {
  return head_from_wte_ && name == "lm_head.weight" ? "wte.weight" : name;
}

void ModelImport::load(const std::vector<ParamTensor>& params, float* weights) const {
  std::vector<float> longer;
  for (const ParamTensor& p : params) {
    const std::string from = source_of(p.name);
    const std::vector<int64_t> held = *source_->shape(from);
    if (p.split()) {  // a tensor rank's part of the whole tensor
      longer.resize(p.tp.whole_size());
      source_->read(from, longer.data());
      take_part(p.tp, p.shape, longer.data(), weights + p.offset);
    } else if (static_cast<size_t>(held[0]) == static_cast<size_t>(p.shape[0])) {
      source_->read(from, weights + p.offset);
    } else {
      longer.resize(static_cast<size_t>(held[0] * held[1]));  // the position table, cut to its first rows
      source_->read(from, longer.data());
      std::copy(longer.begin(), longer.begin() + p.size, weights + p.offset);
    }
    // A NaN or Inf would train into every weight and fail every save: refused here, by name.
    const float* w = weights + p.offset;
    const size_t bad = static_cast<size_t>(std::find_if(w, w + p.size, [](float x) { return !std::isfinite(x); }) - w);
    if (bad < p.size)
      throw SpecError("train.init_from: " + source_->path() + ": tensor " + from + " holds " +
                      (std::isnan(w[bad]) ? "NaN" : "Inf") + " (at element " + std::to_string(bad) +
                      "): a model to start from must be finite");
  }
}

}  // namespace pipetrain
