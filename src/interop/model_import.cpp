#include "pipetrain/interop/model_import.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "pipetrain/model/block_tensors.hpp"
#include "pipetrain/util/binary_file.hpp"

namespace pipetrain {

ModelImport::ModelImport(const std::string& path, const RunSpec& spec) {
  const std::string where = spec.origin("train.init_from") + ": train.init_from = \"" + path + "\": ";
  try {
    source_ = WeightsSource::open(path);
  } catch (const SpecError& e) {  // names the path already
    throw SpecError(spec.origin("train.init_from") + ": train.init_from: " + e.what());
  }
  const WeightsSource& src = *source_;
  const int L = spec.model.n_layer, T = spec.model.seq_len;
  const bool source_tied = !src.shape("lm_head.weight");
  if (spec.model.tie_embeddings && !source_tied)
    throw SpecError(where +
                    "the source has its own lm_head.weight but model.tie_embeddings = true: its head "
                    "would be lost (set model.tie_embeddings = false to keep it)");
  head_from_wte_ = !spec.model.tie_embeddings && source_tied;
  if (const std::string differs = src.mismatch(spec); !differs.empty()) throw SpecError(where + differs);
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
    const std::string tensor = "tensor " + p.name + (from == p.name ? "" : " (from " + from + ")");
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
