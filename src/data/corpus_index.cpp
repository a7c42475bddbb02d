#include "pipetrain/data/corpus_index.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "pipetrain/data/corpus_formats.hpp"
#include "pipetrain/data/token_file.hpp"
#include "pipetrain/util/errors.hpp"

namespace fs = std::filesystem;

namespace pipetrain {
namespace {

using json = nlohmann::json;
constexpr int kIndexFormat = 1;

// A file's identity as the index checks it.
struct Stamp {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const Stamp& o) const { return size == o.size && mtime_ns == o.mtime_ns; }
};
Stamp stamp_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};  // read (and refused) below
  return {static_cast<uint64_t>(st.st_size), int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec};
}

CorpusFile read_facts(const std::string& path, const std::string& format) {
  CorpusFile f;
  if (format != "auto" || is_llmc_shard(path)) {
    const RawTokens raw = raw_tokens(format == "nanogpt"    ? CorpusFormat::nanogpt
                                     : format == "megatron" ? CorpusFormat::megatron
                                                            : CorpusFormat::llmc,
                                     path);
    f.raw_width = raw.width;
    f.raw_offset = raw.offset;
    f.raw_signed = raw.is_signed;
    f.train = raw.count;
    return f;
  }
  const TokenFileInfo info = read_token_file_info(path);
  f.train = info.train;
  f.val = info.val;
  f.vocab = info.vocab_size;
  f.tokenizer = info.tokenizer;
  f.model_hash = info.tokenizer_model.empty() ? 0 : model_hash(info.tokenizer_model);
  f.document_token = info.document_token;
  return f;
}

json entry_of(const CorpusFile& f, const Stamp& s, const std::string& format) {
  return {{"size", s.size},
          {"mtime_ns", s.mtime_ns},
          {"format", format},
          {"raw_width", f.raw_width},
          {"raw_offset", f.raw_offset},
          {"raw_signed", f.raw_signed},
          {"train", f.train},
          {"val", f.val},
          {"vocab", f.vocab},
          {"tokenizer", name_of(f.tokenizer)},
          {"model_hash", f.model_hash},
          {"document_token", f.document_token}};
}

// The entry's facts when it describes the file as it is now, read as `format`.
bool facts_of(const json& e, const Stamp& s, const std::string& format, CorpusFile& f) {
  try {
    if (!(Stamp{e.at("size").get<uint64_t>(), e.at("mtime_ns").get<int64_t>()} == s)) return false;
    const auto tokenizer = choice_named<TokenizerKind>(e.at("tokenizer").get<std::string>());
    if (!tokenizer || e.at("format").get<std::string>() != format) return false;
    f.raw_width = e.at("raw_width").get<int>();
    f.raw_offset = e.at("raw_offset").get<uint64_t>();
    f.raw_signed = e.at("raw_signed").get<bool>();
    f.train = e.at("train").get<uint64_t>();
    f.val = e.at("val").get<uint64_t>();
    f.vocab = e.at("vocab").get<int64_t>();
    f.tokenizer = *tokenizer;
    f.model_hash = e.at("model_hash").get<uint64_t>();
    f.document_token = e.at("document_token").get<int64_t>();
    return true;
  } catch (const json::exception&) {  // an entry of another shape: read the file again
    return false;
  }
}

json read_index(const std::string& path) {
  std::ifstream in(path);
  if (!in) return json::object();
  const json j = json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("format", 0) != kIndexFormat || !j.contains("files") ||
      !j["files"].is_object())
    return json::object();
  return j["files"];
}

// Replaces the folder's index by a file of a name of its own renamed over it: concurrent writers
// (every rank reading the corpus) leave one whole index. Failing (a read-only folder) caches nothing.
void write_index(const std::string& path, const json& files) {
  std::random_device rd;
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(rd());
  {
    std::ofstream out(tmp);
    if (!out) return;
    out << json{{"format", kIndexFormat}, {"by", "pipetrain"}, {"files", files}}.dump();
    if (!out.flush()) {
      std::remove(tmp.c_str());
      return;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) std::remove(tmp.c_str());
}

}  // namespace

uint64_t model_hash(const std::string& model_bytes) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a, 64-bit
  for (unsigned char c : model_bytes) h = (h ^ c) * 1099511628211ull;
  return h | 1;  // never 0, which means "no model"
}

std::vector<CorpusFile> corpus_files(const std::vector<std::string>& files, const std::string& format,
                                     size_t* read_files, std::vector<char>* member) {
  std::vector<CorpusFile> out(files.size());
  if (member) member->assign(files.size(), 1);
  std::map<std::string, std::vector<size_t>> by_folder;  // each folder's files, by their place in `files`
  for (size_t i = 0; i < files.size(); ++i) by_folder[fs::path(files[i]).parent_path().string()].push_back(i);
  size_t opened = 0;
  for (const auto& [folder, members] : by_folder) {
    const std::string index = (folder.empty() ? fs::path(kIndexName) : fs::path(folder) / kIndexName).string();
    json entries = read_index(index);
    bool changed = false;
    for (size_t i : members) {
      const std::string name = fs::path(files[i]).filename().string();
      const Stamp s = stamp_of(files[i]);
      if (entries.contains(name) && facts_of(entries[name], s, format, out[i])) continue;
      ++opened;
      try {
        out[i] = read_facts(files[i], format);
      } catch (const SpecError&) {
        if (!member || format != "auto" || is_llmc_shard(files[i])) throw;  // a damaged shard: never skipped
        (*member)[i] = 0;  // not a corpus file: not indexed, looked at again next time
        continue;
      }
      entries[name] = entry_of(out[i], s, format);
      changed = true;
    }
    if (changed) write_index(index, entries);
  }
  if (read_files) *read_files = opened;
  return out;
}

}  // namespace pipetrain
