#include "pipetrain/data/token_file.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "pipetrain/util/hdf5.hpp"
#include "pipetrain/config/spec.hpp"
#include "pipetrain/util/files.hpp"

namespace fs = std::filesystem;

namespace pipetrain {
namespace {

// Tokens per HDF5 chunk: a shuffled sample reads (and with --compress inflates) one or two chunks,
// so small chunks keep random reads cheap; 64 KiB still compresses well.
constexpr hsize_t kChunk = 1 << 16;
constexpr size_t kBlock = 8 << 20;   // bytes read and written at a time

void write_attr(hid_t obj, const char* name, int64_t value) {
  if (write_scalar_attr(obj, name, value) < 0) throw std::runtime_error(std::string("attribute ") + name);
}
void write_attr(hid_t obj, const char* name, const std::string& value) {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type, std::max<size_t>(1, value.size()));
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attr(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (attr < 0 || H5Awrite(attr, type, value.c_str()) < 0) throw std::runtime_error(std::string("attribute ") + name);
}
hid_t create_dataset(hid_t file, const char* name, hsize_t n, bool compress) {
  Handle space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  const hsize_t chunk = std::max<hsize_t>(1, std::min(kChunk, n));
  H5Pset_chunk(dcpl, 1, &chunk);
  if (compress) H5Pset_deflate(dcpl, 4);
  return H5Dcreate2(file, name, H5T_NATIVE_UINT8, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
}

void write_range(hid_t dataset, hsize_t start, hsize_t n, const uint8_t* data) {
  Handle file_space(H5Dget_space(dataset), H5Sclose);
  H5Sselect_hyperslab(file_space, H5S_SELECT_SET, &start, nullptr, &n, nullptr);
  Handle mem_space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  if (H5Dwrite(dataset, H5T_NATIVE_UINT8, mem_space, file_space, H5P_DEFAULT, data) < 0)
    throw std::runtime_error("cannot write tokens (disk full?)");
}

}  // namespace

std::string prepare_token_file(const PrepareOptions& opt) {
  if (opt.inputs.empty()) throw SpecError("data prepare: no --input file given");
  if (opt.output.empty()) throw SpecError("data prepare: no --output file given");
  if (!(opt.val_fraction >= 0 && opt.val_fraction < 1))
    throw SpecError("data prepare: --val-fraction " + std::to_string(opt.val_fraction) + " is not in [0, 1)");
  std::error_code ec;
  if (fs::exists(opt.output, ec) && !opt.force)
    throw SpecError("data prepare: " + opt.output + " exists (--force replaces it)");
  // Every input readable and non-empty before anything is written.
  uint64_t total = 0;
  nlohmann::json sources = nlohmann::json::array();
  for (const auto& in : opt.inputs) {
    struct stat st;
    if (::stat(in.c_str(), &st) != 0) throw SpecError("data prepare: --input " + in + ": " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) throw SpecError("data prepare: --input " + in + ": not a regular file");
    if (st.st_size == 0) throw SpecError("data prepare: --input " + in + ": empty");
    if (::access(in.c_str(), R_OK) != 0) throw SpecError("data prepare: --input " + in + ": " + std::strerror(errno));
    total += static_cast<uint64_t>(st.st_size);
    sources.push_back({{"path", fs::absolute(in, ec).string()}, {"bytes", st.st_size}});
  }
  const uint64_t val = static_cast<uint64_t>(std::floor(static_cast<double>(total) * opt.val_fraction));
  const uint64_t train = total - val;

  const std::string tmp = opt.output + ".tmp." + std::to_string(::getpid());
  auto cleanup = [&] { fs::remove(tmp, ec); };
  try {
    Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    if (file < 0) throw std::runtime_error("cannot create (directory missing or not writable?)");
    write_attr(file, "format_version", kTokenFileFormat);
    write_attr(file, "vocab_size", 256);
    write_attr(file, "tokenizer", std::string("bytes"));
    const std::time_t now = std::time(nullptr);
    char when[32];
    std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    write_attr(file, "sources", nlohmann::json{{"inputs", sources}, {"val_fraction", opt.val_fraction},
                                                {"created", when}, {"by", "pipetrain data prepare"}}
                                    .dump());
    Handle train_ds(create_dataset(file, "train", train, opt.compress), H5Dclose);
    Handle val_ds(create_dataset(file, "val", val, opt.compress), H5Dclose);
    if (train_ds < 0 || val_ds < 0) throw std::runtime_error("cannot create the datasets");
    // Compressed chunks reach the file when the datasets close: a full disk shows up there.
    auto close = [](Handle& h) {
      const herr_t status = h.close(h.id);
      h.id = -1;
      if (status < 0) throw std::runtime_error("cannot finish writing (disk full?)");
    };
    std::vector<uint8_t> block(kBlock);
    // a progress line every 1/20 of a large input (at least 64 MiB apart)
    const uint64_t report_every = std::max<uint64_t>(64ull << 20, total / 20);
    uint64_t done = 0, next_report = report_every;
    for (const auto& in : opt.inputs) {
      std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(in.c_str(), "rb"), std::fclose);
      if (!f) throw SpecError("data prepare: --input " + in + ": " + std::strerror(errno));
      size_t got;
      while ((got = std::fread(block.data(), 1, block.size(), f.get())) > 0) {
        // the part of this block before the split goes to train, the rest to val
        const uint64_t to_train = done < train ? std::min<uint64_t>(got, train - done) : 0;
        if (to_train) write_range(train_ds, done, to_train, block.data());
        if (got > to_train) write_range(val_ds, done + to_train - train, got - to_train, block.data() + to_train);
        done += got;
        if (total > (64ull << 20) && done >= next_report) {
          std::fprintf(stderr, "data prepare: %s of %s\n", human_bytes(done).c_str(), human_bytes(total).c_str());
          next_report += report_every;
        }
      }
      if (std::ferror(f.get())) throw SpecError("data prepare: --input " + in + ": read error");
    }
    if (done != total) throw SpecError("data prepare: the inputs changed size while being read");
    close(train_ds), close(val_ds), close(file);
    sync_path(tmp);  // on disk before the rename makes it the output
  } catch (const SpecError&) {
    cleanup();
    throw;
  } catch (const std::exception& e) {
    cleanup();
    throw SpecError("data prepare: " + opt.output + ": " + e.what());
  }
  fs::rename(tmp, opt.output, ec);
  if (ec) {
    cleanup();
    throw SpecError("data prepare: " + opt.output + ": " + ec.message());
  }
  return opt.output + ": " + std::to_string(train) + " train and " + std::to_string(val) +
         " validation tokens (bytes, vocab 256) from " + std::to_string(opt.inputs.size()) + " file(s)" +
         (opt.compress ? ", gzip" : "");
}

TokenFile::TokenFile(const std::string& path, const std::string& dataset) : path_(path), dataset_(dataset) {
  file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file_ < 0) throw SpecError(path + ": cannot open as an HDF5 token file (missing? made by pipetrain data prepare?)");
  vocab_ = static_cast<int>(read_scalar_attr(file_, "vocab_size"));
  const int64_t format = read_scalar_attr(file_, "format_version");
  if (H5Lexists(file_, dataset.c_str(), H5P_DEFAULT) <= 0 || vocab_ <= 0) {
    H5Fclose(file_);
    throw SpecError(path + ": has no token dataset /" + dataset + (vocab_ <= 0 ? " or no vocab_size" : ""));
  }
  if (format != kTokenFileFormat) {
    H5Fclose(file_);
    throw SpecError(path + ": token file format " + std::to_string(format) + ", this pipetrain reads " +
                    std::to_string(kTokenFileFormat));
  }
  data_ = H5Dopen2(file_, dataset.c_str(), H5P_DEFAULT);
  Handle space(H5Dget_space(data_), H5Sclose);
  Handle type(H5Dget_type(data_), H5Tclose);
  hsize_t n = 0;
  const bool bytes = H5Tget_class(type) == H5T_INTEGER && H5Tget_size(type) == 1 && H5Tget_sign(type) == H5T_SGN_NONE;
  if (!bytes || H5Sget_simple_extent_ndims(space) != 1 || H5Sget_simple_extent_dims(space, &n, nullptr) < 0) {
    H5Dclose(data_), H5Fclose(file_);
    throw SpecError(path + ": /" + dataset + " is not a 1-D array of byte tokens (uint8)");
  }
  size_ = n;
}

TokenFile::~TokenFile() {
  if (data_ >= 0) H5Dclose(data_);
  if (file_ >= 0) H5Fclose(file_);
}

void TokenFile::read(size_t start, size_t n, uint8_t* out) const {
  hsize_t s = start, c = n;
  Handle file_space(H5Dget_space(data_), H5Sclose);
  H5Sselect_hyperslab(file_space, H5S_SELECT_SET, &s, nullptr, &c, nullptr);
  Handle mem_space(H5Screate_simple(1, &c, nullptr), H5Sclose);
  if (H5Dread(data_, H5T_NATIVE_UINT8, mem_space, file_space, H5P_DEFAULT, out) < 0)
    throw std::runtime_error(path_ + ": cannot read /" + dataset_ + " tokens " + std::to_string(start) + ".." +
                             std::to_string(start + n));
}

}  // namespace pipetrain
