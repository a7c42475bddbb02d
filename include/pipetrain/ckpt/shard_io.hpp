// HDF5 shard files: one per pipeline stage, holding /params/<name>, /optim/exp_avg/<name> and
// /optim/exp_avg_sq/<name> for the tensors that stage owns, with root attributes step and
// format_version. The stage's first replica creates the file, every replica writes its slab (a
// range of rows) of every tensor with plain POSIX writes; read by any process, any layout.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace pipetrain {

constexpr int kCheckpointFormat = 1;

// One named tensor's three arrays: each points at this replica's row slab (row_slab() of its first
// dimension), all that a save writes of it.
struct ShardTensor {
  std::string name;
  std::vector<int> shape;
  const float* param;
  const float* exp_avg;
  const float* exp_avg_sq;
};

struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;
};

// A save writes a shard in two parts, so that only the thread that trains ever
// calls HDF5 (not thread-safe here). create_shard_file (one process: the stage's first replica,
// on the training thread) creates the file with every dataset allocated, contiguous and unfilled,
// and returns the byte offset of each dataset's data in the file: for each tensor, params,
// exp_avg, exp_avg_sq. Then every replica writes its slabs' raw bytes (little-endian float32, as
// the datasets store them) at those offsets with write_slabs: plain POSIX, on any thread. Throws
// std::runtime_error naming the file.
std::vector<uint64_t> create_shard_file(const std::string& path, const std::vector<TensorInfo>& tensors, int64_t step);

struct SlabBytes {
  uint64_t file_offset;
  const float* data;
  size_t floats;
};
// Writes every slab into the existing file and fsyncs it. Returns "" or what failed. The test-only
// kill_in_save hook fires halfway through (checkpoint `step`).
std::string write_slabs(const std::string& path, const std::vector<SlabBytes>& slabs, int64_t step);

// Reads a shard with the serial driver (any process; no MPI needed).
class ShardReader {
 public:
  explicit ShardReader(const std::string& path);  // throws std::runtime_error naming the file
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  int64_t step() const { return step_; }
  int format_version() const { return format_; }
  std::vector<TensorInfo> tensors() const;  // the /params datasets
  bool has(const std::string& name) const;
  // What keeps group ("params", "optim/exp_avg", "optim/exp_avg_sq") / name from being read as a
  // tensor of `shape`: missing, another shape, not stored as 32-bit floats; "" when nothing does.
  std::string problem(const std::string& group, const std::string& name, const std::vector<int>& shape) const;
  // Reads group / name into out; std::runtime_error with problem() when there is one.
  void read(const std::string& group, const std::string& name, const std::vector<int>& shape, float* out) const;

 private:
  std::string path_;
  int64_t file_ = -1;
  int64_t step_ = -1;
  int format_ = -1;
};

// Fast 64-bit content hash of a whole file (corruption detection, not security); also returns
// its size. Throws std::runtime_error if unreadable.
uint64_t file_checksum(const std::string& path, uint64_t* bytes);

}  // namespace pipetrain
