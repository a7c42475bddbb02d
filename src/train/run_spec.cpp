#include "pipetrain/train/run_spec.hpp"

#include <algorithm>

#include "pipetrain/data/corpus_index.hpp"
#include "pipetrain/data/mixture.hpp"
#include "pipetrain/data/token_file.hpp"
#include "pipetrain/interop/model_import.hpp"

namespace pipetrain {

std::vector<ImpliedKey> implied_keys(const RunSpec& s, std::string* unread) {
  std::vector<ImpliedKey> out;
  std::vector<DeclaredKey> declared;
  if (!s.train.init_from.empty()) try {
      declared = ModelImport::open_source(s.train.init_from, s)->declared();
    } catch (const SpecError& e) {
      *unread = e.what();
    }
  // A spec that names another family keeps it: the import refuses it by name, before any key of
  // the source's family could make the spec itself inconsistent.
  const bool other_family = !declared.empty() && declared.front().key == "model.arch" &&
                            s.origin("model.arch") != "(default)" &&
                            declared.front().value != "\"" + std::string(name_of(s.model.arch)) + "\"";
  if (!other_family)
    for (const DeclaredKey& d : declared) out.push_back({d.key, d.value, "train.init_from's " + d.theirs});
  if (s.data.source == DataSource::hdf5 && !s.data.path.empty()) try {
      out.push_back({"model.vocab", std::to_string(read_token_file_info(s.data.path).vocab_size),
                     "data.path's vocab_size (" + s.data.path + ")"});
    } catch (const SpecError&) {
    }
  if (!s.data.sources.empty()) try {                           // the largest of the mixture's files'
      int64_t vocab = 0;                                       // (llm.c shards record none)
      for (const RunSpec::Data::Source& src : s.data.sources)  // from the folders' indexes where current
        for (const CorpusFile& f : corpus_files(source_files(src.path, src.format), src.format))
          vocab = std::max(vocab, f.vocab);
      if (vocab > 0) out.push_back({"model.vocab", std::to_string(vocab), "data.sources' largest vocab_size"});
    } catch (const SpecError&) {  // the Dataset names what is wrong
    }
  return out;
}

RunSpec load_run_spec(const std::string& path, const std::vector<std::string>& overrides, int world_size,
                      const std::string& ranks_are) {
  const RunSpec unchecked = load_spec(path, overrides, kUnchecked);
  std::string unread;
  const std::vector<ImpliedKey> implied = implied_keys(unchecked, &unread);
  try {
    return load_spec(path, overrides, world_size, SpecContext{ranks_are, implied});
  } catch (const SpecError& e) {
    if (unread.empty()) throw;
    throw SpecError(std::string(e.what()) + " (no key was taken from train.init_from: " + unread + ")");
  }
}

}  // namespace pipetrain
