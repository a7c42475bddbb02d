#include "pipetrain/interop/safetensors.hpp"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <tuple>

#include "pipetrain/util/errors.hpp"

using json = nlohmann::json;

namespace pipetrain {
namespace {

// A header larger than this is not a model's (GPT-2 XL's is 60 KB).
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

const char* spelling(StoredFloat t) { return t == StoredFloat::f32 ? "F32" : t == StoredFloat::bf16 ? "BF16" : "F16"; }

bool stored_float(const std::string& dtype, StoredFloat* t) {
  for (StoredFloat c : {StoredFloat::f32, StoredFloat::bf16, StoredFloat::f16})
    if (dtype == spelling(c)) {
      *t = c;
      return true;
    }
  return false;
}

// Bytes per element of every dtype the format defines (so a file holding other tensors we never
// read is still checked whole).
int element_bytes(const std::string& dtype) {
  static const std::map<std::string, int> sizes = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
                                                   {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
                                                   {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

}  // namespace

bool SafetensorsFile::looks_like(const std::string& path) {
  unsigned char head[9];
  const bool got = BinaryReader(path).read_at(0, head, sizeof head);
  uint64_t n = 0;
  std::memcpy(&n, head, 8);
  return got && n >= 2 && n <= kMaxHeaderBytes && head[8] == '{';
}

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  auto bad = [&](const std::string& why) { return SpecError(path + ": not a valid safetensors file (" + why + ")"); };
  const uint64_t size = file_.size();
  uint64_t n = 0;
  if (size < 8 || !file_.read_at(0, &n, 8)) throw bad("shorter than its 8-byte header length");
  if (n > kMaxHeaderBytes || 8 + n > size)
    throw bad("header length " + std::to_string(n) + " does not fit the file's " + std::to_string(size) + " bytes");
  std::string text(n, '\0');
  if (!file_.read_at(8, text.data(), n)) throw bad("cannot read the header");
  data_start_ = 8 + n;
  const uint64_t data_bytes = size - data_start_;
  try {
    const json header = json::parse(text);
    if (!header.is_object()) throw bad("the header is not a JSON object");
    for (auto& [name, t] : header.items()) {
      if (name == "__metadata__") continue;
      SafetensorsEntry e;
      e.name = name;
      e.dtype = t.at("dtype").get<std::string>();
      e.shape = t.at("shape").get<std::vector<int64_t>>();
      const auto offsets = t.at("data_offsets").get<std::vector<uint64_t>>();
      if (offsets.size() != 2) throw bad(name + ": data_offsets needs [begin, end]");
      e.begin = offsets[0];
      e.end = offsets[1];
      uint64_t count = 1;  // checked for overflow here: element_count() trusts its shape
      for (int64_t d : e.shape) {
        if (d < 0 || (d > 0 && count > UINT64_MAX / static_cast<uint64_t>(d) / 8)) throw bad(name + ": bad shape");
        count *= static_cast<uint64_t>(d);
      }
      const int eb = element_bytes(e.dtype);
      if (eb == 0) throw bad(name + ": unknown dtype " + e.dtype);
      if (e.begin > e.end || e.end > data_bytes || e.end - e.begin != count * eb)
        throw bad(name + ": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                  "] do not hold its " + std::to_string(count) + " " + e.dtype + " values within the file");
      entries_.push_back(std::move(e));
    }
  } catch (const json::exception& e) {
    throw bad(std::string("header: ") + e.what());
  }
  // The tensors tile the data area: each starts where the one before ends, from byte 0 to the
  // file's end. An overlap would give two tensors the same bytes, a hole hide bytes no tensor owns.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : entries_) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](auto* a, auto* b) { return std::tie(a->begin, a->end) < std::tie(b->begin, b->end); });
  uint64_t covered = 0;
  const SafetensorsEntry* before = nullptr;
  auto range = [](const SafetensorsEntry& e) {
    return e.name + " [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ")";
  };
  for (const SafetensorsEntry* e : by_offset) {
    if (e->begin < covered)
      throw bad("tensors " + range(*before) + " and " + range(*e) +
                " overlap: the format gives each tensor its own bytes");
    if (e->begin > covered)
      throw bad(std::to_string(e->begin - covered) + " bytes before tensor " + range(*e) +
                " belong to no tensor: the tensors must tile the data area");
    covered = e->end;
    before = e;
  }
  if (covered != data_bytes)
    throw bad(std::to_string(data_bytes - covered) +
              " bytes after the last tensor belong to no tensor: the tensors "
              "must tile the data area");
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  for (auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

void SafetensorsFile::read(const SafetensorsEntry& e, float* out) const {
  StoredFloat t;
  if (!stored_float(e.dtype, &t))
    throw SpecError(path() + ": tensor " + e.name + " is " + e.dtype + "; model weights must be F32, BF16 or F16");
  std::vector<unsigned char> bytes(e.end - e.begin);
  if (!file_.read_at(data_start_ + e.begin, bytes.data(), bytes.size()))
    throw SpecError(path() + ": cannot read tensor " + e.name);
  decode_floats(bytes.data(), bytes.size() / stored_bytes(t), t, out);
}

std::string safetensors_header(const std::vector<SafetensorsTensor>& tensors, StoredFloat dtype,
                               const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  uint64_t offset = 0;
  for (auto& t : tensors) {
    const uint64_t end = offset + element_count(t.shape) * stored_bytes(dtype);
    header[t.name] = {{"dtype", spelling(dtype)}, {"shape", t.shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + text;
}

void write_safetensors(BinaryWriter& out, const std::vector<SafetensorsTensor>& tensors, StoredFloat dtype,
                       const std::map<std::string, std::string>& metadata) {
  const std::string header = safetensors_header(tensors, dtype, metadata);
  out.write(header.data(), header.size());
  std::vector<float> values;
  std::vector<unsigned char> bytes;
  for (auto& t : tensors) {
    const size_t count = static_cast<size_t>(element_count(t.shape));
    values.resize(count);
    bytes.resize(count * stored_bytes(dtype));
    t.fill(values.data());
    encode_floats(values.data(), count, dtype, bytes.data());
    out.write(bytes.data(), bytes.size());
  }
}

}  // namespace pipetrain
