#include "pipetrain/data/token_file.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "pipetrain/util/binary_file.hpp"
#include "pipetrain/util/errors.hpp"
#include "pipetrain/util/files.hpp"
#include "pipetrain/util/hdf5.hpp"

namespace fs = std::filesystem;

namespace pipetrain {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token files and imports assume a little-endian host");

// Tokens per HDF5 chunk: a shuffled sample reads (and with --compress inflates) one or two chunks,
// so small chunks keep random reads cheap; 64 Ki tokens still compress well.
constexpr hsize_t kChunk = 1 << 16;

const char* dataset_name(Split split) { return split == Split::train ? "train" : "val"; }

hid_t stored_type(int width) { return width == 1 ? H5T_STD_U8LE : width == 2 ? H5T_STD_U16LE : H5T_STD_U32LE; }

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
// A string attribute, fixed-length (as pipetrain writes them) or variable-length (h5py's
// default); "" when missing or not a string.
std::string read_string_attr(hid_t obj, const char* name) {
  if (H5Aexists(obj, name) <= 0) return "";
  Handle attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  Handle type(H5Aget_type(attr), H5Tclose);
  if (H5Tget_class(type) != H5T_STRING) return "";
  if (H5Tis_variable_str(type) > 0) {
    char* text = nullptr;
    Handle memtype(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(memtype, H5T_VARIABLE);
    H5Tset_cset(memtype, H5Tget_cset(type));  // h5py writes UTF-8; HDF5 converts no character sets
    if (H5Aread(attr, memtype, &text) < 0 || !text) return "";
    std::string value(text);
    H5free_memory(text);
    return value;
  }
  std::string value(H5Tget_size(type), '\0');
  if (H5Aread(attr, type, value.data()) < 0) return "";
  return value.substr(0, value.find('\0'));
}

// A 1-D unsigned integer dataset's length and width; SpecError naming what is wrong.
void describe_tokens(hid_t data, const std::string& what, size_t* n, int* width) {
  Handle space(H5Dget_space(data), H5Sclose);
  Handle type(H5Dget_type(data), H5Tclose);
  const size_t w = H5Tget_size(type);
  hsize_t dims = 0;
  if (H5Tget_class(type) != H5T_INTEGER || H5Tget_sign(type) != H5T_SGN_NONE || (w != 1 && w != 2 && w != 4) ||
      H5Sget_simple_extent_ndims(space) != 1 || H5Sget_simple_extent_dims(space, &dims, nullptr) < 0)
    throw SpecError(what + " is not a 1-D array of unsigned 8-, 16- or 32-bit token ids");
  *n = dims;
  *width = static_cast<int>(w);
}

// Opens a token file read-only and checks its format version; the caller owns the id.
hid_t open_token_file(const std::string& path) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0)
    throw SpecError(path + ": cannot open as an HDF5 token file (missing? made by pipetrain data prepare?)");
  const int64_t format = read_scalar_attr(file, "format_version");
  if (format != 1 && format != kTokenFileFormat) {
    H5Fclose(file);
    throw SpecError(path + ": token file format " + std::to_string(format) + ", this pipetrain reads 1 and " +
                    std::to_string(kTokenFileFormat));
  }
  return file;
}

}  // namespace

int token_width_for(int64_t vocab) { return vocab <= 256 ? 1 : vocab <= 65536 ? 2 : 4; }
const char* token_dtype_name(int width) { return width == 1 ? "uint8" : width == 2 ? "uint16" : "uint32"; }

void widen_ids(const uint8_t* raw, size_t n, int width, uint32_t* out) {
  if (width == 1) {
    for (size_t i = 0; i < n; ++i) out[i] = raw[i];
  } else if (width == 2) {
    for (size_t i = 0; i < n; ++i) {
      uint16_t v;
      std::memcpy(&v, raw + 2 * i, 2);
      out[i] = v;
    }
  } else {
    std::memcpy(out, raw, 4 * n);
  }
}

uint64_t input_bytes(const std::vector<std::string>& inputs, const std::string& what) {
  uint64_t total = 0;
  for (const auto& in : inputs) {
    struct stat st {};
    if (::stat(in.c_str(), &st) != 0) throw SpecError(what + " " + in + ": " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) throw SpecError(what + " " + in + ": not a regular file");
    if (st.st_size == 0) throw SpecError(what + " " + in + ": empty");
    if (::access(in.c_str(), R_OK) != 0) throw SpecError(what + " " + in + ": " + std::strerror(errno));
    total += static_cast<uint64_t>(st.st_size);
  }
  return total;
}

std::string sources_json(const std::vector<std::string>& inputs, const std::string& by, const std::string& extra_json) {
  nlohmann::json list = nlohmann::json::array();
  std::error_code ec;
  for (const auto& in : inputs) {
    struct stat st {};
    ::stat(in.c_str(), &st);
    list.push_back({{"path", fs::absolute(in, ec).string()}, {"bytes", st.st_size}});
  }
  const std::time_t now = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  nlohmann::json j = extra_json.empty() ? nlohmann::json::object() : nlohmann::json::parse(extra_json);
  j["inputs"] = list;
  j["created"] = when;
  j["by"] = by;
  return j.dump();
}

// ---- reading ----

TokenFile::TokenFile(const std::string& path, Split split) : path_(path), dataset_(dataset_name(split)) {
  file_ = open_token_file(path);
  vocab_ = read_scalar_attr(file_, "vocab_size");
  if (H5Lexists(file_, dataset_.c_str(), H5P_DEFAULT) <= 0 || vocab_ <= 0) {
    H5Fclose(file_);
    throw SpecError(path + ": has no token dataset /" + dataset_ + (vocab_ <= 0 ? " or no vocab_size" : ""));
  }
  data_ = H5Dopen2(file_, dataset_.c_str(), H5P_DEFAULT);
  try {
    describe_tokens(data_, path + ": /" + dataset_, &size_, &width_);
  } catch (...) {
    H5Dclose(data_);
    H5Fclose(file_);
    throw;
  }
}

TokenFile::~TokenFile() {
  if (data_ >= 0) H5Dclose(data_);
  if (file_ >= 0) H5Fclose(file_);
}

void TokenFile::read(size_t start, size_t n, uint32_t* out) const {
  hsize_t s = start, c = n;
  Handle file_space(H5Dget_space(data_), H5Sclose);
  H5Sselect_hyperslab(file_space, H5S_SELECT_SET, &s, nullptr, &c, nullptr);
  Handle mem_space(H5Screate_simple(1, &c, nullptr), H5Sclose);
  if (H5Dread(data_, H5T_NATIVE_UINT32, mem_space, file_space, H5P_DEFAULT, out) < 0)
    throw std::runtime_error(path_ + ": cannot read /" + dataset_ + " tokens " + std::to_string(start) + ".." +
                             std::to_string(start + n));
  for (size_t i = 0; i < n; ++i)
    if (out[i] >= vocab_)
      throw SpecError(path_ + ": /" + dataset_ + " token " + std::to_string(start + i) + " is " +
                      std::to_string(out[i]) + ", not below the file's vocab_size " + std::to_string(vocab_));
}

TokenFileInfo read_token_file_info(const std::string& path) {
  Handle file(open_token_file(path), H5Fclose);
  TokenFileInfo info;
  info.format = static_cast<int>(read_scalar_attr(file, "format_version"));
  info.vocab_size = read_scalar_attr(file, "vocab_size");
  const std::string tokenizer = read_string_attr(file, "tokenizer");
  if (tokenizer.empty()) {
    info.tokenizer = info.format == 1 ? TokenizerKind::bytes : TokenizerKind::none;  // files made by other tools
  } else {
    info.tokenizer = parse_choice(path + ": tokenizer", tokenizer,
                                  {TokenizerKind::bytes, TokenizerKind::sentencepiece, TokenizerKind::none});
  }
  info.sources = read_string_attr(file, "sources");
  if (H5Aexists(file, "document_token") > 0) info.document_token = read_scalar_attr(file, "document_token");
  for (Split split : {Split::train, Split::val}) {
    const char* name = dataset_name(split);
    if (H5Lexists(file, name, H5P_DEFAULT) <= 0) {
      if (split == Split::val) break;  // no held-out tokens
      throw SpecError(path + ": has no token dataset /" + name);
    }
    Handle data(H5Dopen2(file, name, H5P_DEFAULT), H5Dclose);
    describe_tokens(data, path + ": /" + name, split == Split::train ? &info.train : &info.val, &info.width);
    Handle dcpl(H5Dget_create_plist(data), H5Pclose);
    info.compressed = info.compressed || H5Pget_nfilters(dcpl) > 0;
    const std::string starts = std::string(name) + "_documents";
    if (H5Lexists(file, starts.c_str(), H5P_DEFAULT) > 0) {
      Handle d(H5Dopen2(file, starts.c_str(), H5P_DEFAULT), H5Dclose);
      Handle space(H5Dget_space(d), H5Sclose);
      (split == Split::train ? info.train_documents : info.val_documents) =
          static_cast<size_t>(std::max<hssize_t>(0, H5Sget_simple_extent_npoints(space)));
    }
  }
  if (info.tokenizer == TokenizerKind::sentencepiece) {
    if (H5Lexists(file, "tokenizer_model", H5P_DEFAULT) <= 0)
      throw SpecError(path + ": tokenizer sentencepiece but no /tokenizer_model");
    Handle data(H5Dopen2(file, "tokenizer_model", H5P_DEFAULT), H5Dclose);
    Handle space(H5Dget_space(data), H5Sclose);
    const hssize_t n = H5Sget_simple_extent_npoints(space);
    info.tokenizer_model.resize(n > 0 ? static_cast<size_t>(n) : 0);
    if (n <= 0 || H5Dread(data, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, info.tokenizer_model.data()) < 0)
      throw SpecError(path + ": cannot read /tokenizer_model");
  }
  return info;
}

bool is_token_file(const std::string& path) {
  static const unsigned char kHdf5Signature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  if (!file_starts_with(path, kHdf5Signature, sizeof kHdf5Signature)) return false;
  try {
    read_token_file_info(path);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

OutputRule token_file_output(const std::string& command, const std::vector<std::string>& inputs, bool force) {
  return {command, "--output", "a token file", is_token_file, inputs, force};
}

// ---- writing ----

TokenFileWriter::TokenFileWriter(Options opt, uint64_t train, uint64_t val)
    : opt_(std::move(opt)),
      output_(opt_.output, token_file_output(opt_.what, opt_.inputs, opt_.force)),
      train_(train),
      val_(val) {
  // HDF5 1.8's object format stores attributes of any size densely: `sources` lists every input,
  // which for a corpus of a thousand shards is well over the 64 KiB of the oldest format.
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST);
  file_ = H5Fcreate(output_.staging().c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  if (file_ < 0) throw SpecError(opt_.what + ": " + opt_.output + ": cannot create (not writable?)");
  try {
    write_attr(file_, "format_version", kTokenFileFormat);
    write_attr(file_, "tokenizer", std::string(name_of(opt_.tokenizer)));
    auto create = [&](const char* name, hsize_t n) {
      Handle space(H5Screate_simple(1, &n, nullptr), H5Sclose);
      Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
      const hsize_t chunk = std::max<hsize_t>(1, std::min(kChunk, n));
      if (H5Pset_chunk(dcpl, 1, &chunk) < 0 || (opt_.compress && H5Pset_deflate(dcpl, 4) < 0))
        throw std::runtime_error("this HDF5 cannot chunk or gzip datasets");
      const hid_t d = H5Dcreate2(file_, name, stored_type(opt_.width), space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
      if (d < 0) throw std::runtime_error(std::string("cannot create /") + name);
      return d;
    };
    train_ds_ = create("train", train_);
    val_ds_ = create("val", val_);
    if (!opt_.tokenizer_model.empty()) {
      hsize_t n = opt_.tokenizer_model.size();
      Handle space(H5Screate_simple(1, &n, nullptr), H5Sclose);
      Handle d(H5Dcreate2(file_, "tokenizer_model", H5T_STD_U8LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
               H5Dclose);
      if (d < 0 || H5Dwrite(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, opt_.tokenizer_model.data()) < 0)
        throw std::runtime_error("cannot write /tokenizer_model");
    }
  } catch (const std::exception& e) {
    close_all();
    throw SpecError(opt_.what + ": " + opt_.output + ": " + e.what());
  }
}

// Not committed: the handles close here and AtomicOutput removes the staging file.
TokenFileWriter::~TokenFileWriter() { close_all(); }

void TokenFileWriter::close_all() {
  for (int64_t* d : {&train_ds_, &val_ds_})
    if (*d >= 0) {
      H5Dclose(*d);
      *d = -1;
    }
  if (file_ >= 0) {
    H5Fclose(file_);
    file_ = -1;
  }
}

int64_t TokenFileWriter::vocab() const { return opt_.vocab > 0 ? opt_.vocab : static_cast<int64_t>(max_id_) + 1; }

void TokenFileWriter::write(int64_t dataset, uint64_t start, uint64_t n, const void* data) {
  hsize_t s = start, c = n;
  Handle file_space(H5Dget_space(dataset), H5Sclose);
  H5Sselect_hyperslab(file_space, H5S_SELECT_SET, &s, nullptr, &c, nullptr);
  Handle mem_space(H5Screate_simple(1, &c, nullptr), H5Sclose);
  if (H5Dwrite(dataset, stored_type(opt_.width), mem_space, file_space, H5P_DEFAULT, data) < 0)
    throw std::runtime_error(opt_.what + ": " + opt_.output + ": cannot write tokens (" + free_space_note(opt_.output) +
                             ")");
}

void TokenFileWriter::append(const uint32_t* ids, size_t n, const std::string& source, uint64_t source_offset) {
  if (done_ + n > train_ + val_)
    throw SpecError(opt_.what + ": " + source + ": more tokens than counted (changed while read?)");
  const uint64_t limit = opt_.vocab > 0 ? static_cast<uint64_t>(opt_.vocab) : (1ull << (8 * opt_.width));
  // One pass that narrows and finds the largest id (vectorised); the offender is looked up only
  // when there is one.
  uint32_t largest = 0;
  const void* stored = ids;
  auto narrow = [&](auto& out) {
    out.resize(n);
    using Stored = typename std::decay_t<decltype(out)>::value_type;
    for (size_t i = 0; i < n; ++i) {
      largest = std::max(largest, ids[i]);
      out[i] = static_cast<Stored>(ids[i]);
    }
    stored = out.data();
  };
  if (opt_.width == 1) narrow(narrow8_);
  else if (opt_.width == 2) narrow(narrow16_);
  else largest = n ? *std::max_element(ids, ids + n) : 0;
  if (largest >= limit) {
    const size_t i = static_cast<size_t>(std::find_if(ids, ids + n, [&](uint32_t id) { return id >= limit; }) - ids);
    throw SpecError(opt_.what + ": " + source + ": token " + std::to_string(source_offset + i) + " is " +
                    std::to_string(ids[i]) + ", not below the vocabulary size " + std::to_string(limit) +
                    (opt_.vocab > 0 ? " (--vocab-size)" : ""));
  }
  max_id_ = std::max(max_id_, largest);
  if (opt_.document_token >= 0)  // the token after each separator begins a document (a split's first: commit)
    for (size_t i = 0; i < n; ++i) {
      const uint64_t next = done_ + i + 1;
      if (ids[i] != static_cast<uint32_t>(opt_.document_token) || next == train_ || next >= train_ + val_) continue;
      if (next < train_) documents_[0].push_back(next);
      else documents_[1].push_back(next - train_);
    }
  const uint64_t to_train = done_ < train_ ? std::min<uint64_t>(n, train_ - done_) : 0;
  const auto* bytes = static_cast<const uint8_t*>(stored);
  if (to_train) write(train_ds_, done_, to_train, bytes);
  if (n > to_train) write(val_ds_, done_ + to_train - train_, n - to_train, bytes + to_train * opt_.width);
  done_ += n;
}

void TokenFileWriter::commit(const std::string& sources) {
  if (done_ != train_ + val_) throw SpecError(opt_.what + ": the inputs changed size while being read");
  try {
    write_attr(file_, "vocab_size", vocab());
    write_attr(file_, "sources", sources);
    if (opt_.document_token >= 0) {
      write_attr(file_, "document_token", opt_.document_token);
      for (int split : {0, 1}) {
        if ((split ? val_ : train_) > 0) documents_[split].insert(documents_[split].begin(), 0);
        const std::string name = std::string(dataset_name(split ? Split::val : Split::train)) + "_documents";
        hsize_t n = documents_[split].size();
        Handle space(H5Screate_simple(1, &n, nullptr), H5Sclose);
        Handle d(H5Dcreate2(file_, name.c_str(), H5T_STD_U64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                 H5Dclose);
        if (d < 0 || (n && H5Dwrite(d, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, documents_[split].data()) < 0))
          throw std::runtime_error("cannot write /" + name);
      }
    }
    // Compressed chunks reach the file when the datasets close: a full disk shows up here.
    for (int64_t* h : {&train_ds_, &val_ds_, &file_}) {
      const herr_t status = h == &file_ ? H5Fclose(*h) : H5Dclose(*h);
      *h = -1;
      if (status < 0) throw std::runtime_error("cannot finish writing (disk full?)");
    }
    output_.commit();                  // fsync, rename into place
  } catch (const std::exception& e) {  // the disk, not the input: a fault
    throw std::runtime_error(opt_.what + ": " + opt_.output + ": " + e.what() + " (" + free_space_note(opt_.output) +
                             ")");
  }
}

}  // namespace pipetrain
