#include "pipetrain/ckpt/shard_io.hpp"
#include "pipetrain/util/faults.hpp"

#include "pipetrain/model/optimizer_shard.hpp"
#include "pipetrain/util/hdf5.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace pipetrain {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

// Network/parallel file systems often lack the locks HDF5 1.10 takes by default; checkpoints are
// written once and then only read, so locking buys nothing here.
hid_t file_access() {
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_file_locking(fapl, false, true);
  return fapl;
}

// The attributes and every dataset of a shard being created, each dataset's data offset appended.
void add_datasets(const std::string& path, hid_t file, const std::vector<TensorInfo>& tensors, int64_t step,
                  std::vector<uint64_t>& offsets) {
  if (write_scalar_attr(file, "step", step) < 0 || write_scalar_attr(file, "format_version", kCheckpointFormat) < 0)
    fail(path, "cannot write the shard's attributes");
  Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl, 1);
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);  // contiguous, allocated now, never filled
  H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);
  H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
  for (const TensorInfo& t : tensors) {
    std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
    Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
    for (const char* group : {"params/", "optim/exp_avg/", "optim/exp_avg_sq/"}) {
      const std::string dname = group + t.name;
      Handle ds(H5Dcreate2(file, dname.c_str(), H5T_IEEE_F32LE, space, lcpl, dcpl, H5P_DEFAULT), H5Dclose);
      const haddr_t at = ds >= 0 ? H5Dget_offset(ds) : HADDR_UNDEF;
      if (at == HADDR_UNDEF) fail(path, "cannot create dataset " + dname);
      offsets.push_back(at);
    }
  }
}

}  // namespace

std::vector<uint64_t> create_shard_file(const std::string& path, const std::vector<TensorInfo>& tensors, int64_t step) {
  Handle fapl(file_access(), H5Pclose);
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  if (file < 0) fail(path, "cannot create checkpoint shard");
  std::vector<uint64_t> offsets;
  try {
    add_datasets(path, file, tensors, step, offsets);
  } catch (...) {
    H5Fclose(file);
    throw;
  }
  if (H5Fclose(file) < 0) fail(path, "cannot close checkpoint shard (metadata not written)");
  return offsets;
}

std::string write_slabs(const std::string& path, const std::vector<SlabBytes>& slabs, int64_t step) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return path + ": cannot open checkpoint shard (" + std::strerror(errno) + ")";
  std::string error;
  for (size_t i = 0; i < slabs.size() && error.empty(); ++i) {
    if (i == slabs.size() / 2) fault_hooks().reach(FaultPoint::kill_in_save, step);  // test-only
    const char* p = reinterpret_cast<const char*>(slabs[i].data);
    size_t left = slabs[i].floats * sizeof(float);
    off_t at = static_cast<off_t>(slabs[i].file_offset);
    while (left > 0 && error.empty()) {
      const ssize_t n = ::pwrite(fd, p, left, at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        error = path + ": cannot write (" + std::strerror(n < 0 ? errno : ENOSPC) + ")";
      } else {
        p += n;
        left -= static_cast<size_t>(n);
        at += n;
      }
    }
  }
  if (error.empty() && ::fsync(fd) != 0) error = path + ": cannot sync (" + std::strerror(errno) + ")";
  ::close(fd);
  return error;
}

ShardReader::ShardReader(const std::string& path) : path_(path) {
  Handle fapl(file_access(), H5Pclose);
  file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl);
  if (file_ < 0) fail(path, "cannot open checkpoint shard (missing or not HDF5)");
  step_ = read_scalar_attr(file_, "step");
  format_ = static_cast<int>(read_scalar_attr(file_, "format_version"));
}

ShardReader::~ShardReader() {
  if (file_ >= 0) H5Fclose(file_);
}

std::vector<TensorInfo> ShardReader::tensors() const {
  std::vector<TensorInfo> out;
  if (H5Lexists(file_, "params", H5P_DEFAULT) <= 0) return out;
  Handle group(H5Gopen2(file_, "params", H5P_DEFAULT), H5Gclose);
  H5G_info_t info;
  H5Gget_info(group, &info);
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    char name[1024];
    H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT);
    Handle ds(H5Dopen2(group, name, H5P_DEFAULT), H5Dclose);
    Handle space(H5Dget_space(ds), H5Sclose);
    int rank = H5Sget_simple_extent_ndims(space);
    std::vector<hsize_t> dims(rank > 0 ? rank : 0);
    H5Sget_simple_extent_dims(space, dims.data(), nullptr);
    out.push_back({name, std::vector<int64_t>(dims.begin(), dims.end())});
  }
  return out;
}

bool ShardReader::has(const std::string& name) const {
  const std::string p = "params/" + name;
  return H5Lexists(file_, "params", H5P_DEFAULT) > 0 && H5Lexists(file_, p.c_str(), H5P_DEFAULT) > 0;
}

namespace {

std::string dims_text(const std::vector<hsize_t>& dims) {
  std::string out;
  for (size_t d = 0; d < dims.size(); ++d) out += (d ? "x" : "") + std::to_string(dims[d]);
  return dims.empty() ? "a scalar" : out;
}

}  // namespace

std::string ShardReader::problem(const std::string& group, const std::string& name,
                                 const std::vector<int>& shape) const {
  const std::string dname = group + "/" + name;
  if (H5Lexists(file_, group.c_str(), H5P_DEFAULT) <= 0 || H5Lexists(file_, dname.c_str(), H5P_DEFAULT) <= 0)
    return path_ + ": has no dataset " + dname;
  Handle ds(H5Dopen2(file_, dname.c_str(), H5P_DEFAULT), H5Dclose);
  if (ds < 0) return path_ + ": " + dname + " is not a dataset";
  Handle space(H5Dget_space(ds), H5Sclose);
  std::vector<hsize_t> dims(std::max(0, H5Sget_simple_extent_ndims(space)));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  const std::vector<hsize_t> want(shape.begin(), shape.end());
  if (dims != want)
    return path_ + ": " + dname + " is " + dims_text(dims) + ", not the " + dims_text(want) + " the model has for " +
           name;
  Handle type(H5Dget_type(ds), H5Tclose);
  if (H5Tget_class(type) != H5T_FLOAT || H5Tget_size(type) != sizeof(float))
    return path_ + ": " + dname + " is stored as " + (H5Tget_class(type) == H5T_INTEGER ? "integers" : "another type") +
           " of " + std::to_string(H5Tget_size(type)) +
           " bytes, not 32-bit floats (reading it would convert the values)";
  return "";
}

void ShardReader::read(const std::string& group, const std::string& name, const std::vector<int>& shape,
                       float* out) const {
  if (const std::string why = problem(group, name, shape); !why.empty()) throw std::runtime_error(why);
  const std::string dname = group + "/" + name;
  Handle ds(H5Dopen2(file_, dname.c_str(), H5P_DEFAULT), H5Dclose);
  if (H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0) fail(path_, "cannot read " + dname);
}

uint64_t file_checksum(const std::string& path, uint64_t* bytes) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail(path, std::string("cannot read (") + std::strerror(errno) + ")");
  // Four independent multiply-rotate lanes over 8-byte words (xxHash-style), then a final mix.
  const uint64_t p1 = 0x9E3779B185EBCA87ULL, p2 = 0xC2B2AE3D27D4EB4FULL;
  uint64_t lane[4] = {p1, p2, p1 ^ p2, p1 + p2}, total = 0;
  std::vector<unsigned char> buf(1 << 20);
  size_t got;
  while ((got = std::fread(buf.data(), 1, buf.size(), f)) > 0) {
    size_t i = 0;
    for (; i + 32 <= got; i += 32)
      for (int l = 0; l < 4; ++l) {
        uint64_t w;
        std::memcpy(&w, &buf[i + 8 * l], 8);
        lane[l] = ((lane[l] + w * p2) << 31 | (lane[l] + w * p2) >> 33) * p1;
      }
    for (; i < got; ++i) lane[i & 3] = (lane[i & 3] ^ buf[i]) * p1;
    total += got;
  }
  const bool bad = std::ferror(f);
  std::fclose(f);
  if (bad) fail(path, "read error");
  uint64_t h = total * p1;
  for (uint64_t l : lane) {
    h = (h ^ (l * p2)) * p1;
    h ^= h >> 29;
  }
  if (bytes) *bytes = total;
  return h;
}

}  // namespace pipetrain
