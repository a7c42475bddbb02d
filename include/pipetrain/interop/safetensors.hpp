// The safetensors container: an 8-byte little-endian header length N, N bytes of JSON
// ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, ..., "__metadata__": {...}}, offsets
// relative to the first byte after the header), then the tensors' bytes packed without gaps.
// Read for train.init_from (F32, BF16 and F16 tensors), written by `pipetrain export --format hf`.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "pipetrain/interop/float_formats.hpp"
#include "pipetrain/util/binary_file.hpp"

namespace pipetrain {

struct SafetensorsEntry {
  std::string name, dtype;  // dtype as the file spells it: "F32", "BF16", "F16", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range after the header
};

// An open safetensors file: its header parsed and checked against the file's size.
class SafetensorsFile {
 public:
  // SpecError naming the file when it is not a well-formed safetensors file.
  explicit SafetensorsFile(const std::string& path);

  // True when the file starts like one (a plausible header length, then '{'): for telling file kinds apart.
  static bool looks_like(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* find(const std::string& name) const;  // nullptr when absent
  // The tensor's values as fp32 (row-major, as stored). SpecError for a dtype other than F32, BF16, F16.
  void read(const SafetensorsEntry& e, float* out) const;

 private:
  BinaryReader file_;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
};

// One tensor to write: its name, shape, and a function that fills its fp32 values (row-major).
struct SafetensorsTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::function<void(float*)> fill;
};

// The length field and JSON header for `tensors` stored as `dtype`, in that order, padded with
// spaces so the data starts at a multiple of 8 bytes.
std::string safetensors_header(const std::vector<SafetensorsTensor>& tensors, StoredFloat dtype,
                               const std::map<std::string, std::string>& metadata);

// Writes the whole file: the header, then each tensor's values (filled one tensor at a time).
void write_safetensors(BinaryWriter& out, const std::vector<SafetensorsTensor>& tensors, StoredFloat dtype,
                       const std::map<std::string, std::string>& metadata);

}  // namespace pipetrain
