// What every HDF5 user in pipetrain shares: HDF5 kept quiet (we report errors ourselves, naming
// the file) and kept from cleaning up at exit, and a scope guard for its handles.
#pragma once
#include <hdf5.h>

#include <cstdint>

namespace pipetrain {

// No HDF5 clean-up at exit: after a failed H5Fclose (disk full while flushing metadata) the file
// stays half-closed in HDF5's tables, and closing it again at exit, after MPI_Finalize, crashed
// every rank. Every file we open is closed by its owner; the OS frees the rest.
struct QuietHdf5 {
  QuietHdf5() {
    H5dont_atexit();  // must come before anything initialises the library
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
};
inline const QuietHdf5 quiet_hdf5;  // one for the program, before main

// Closes an HDF5 handle of any kind when it goes out of scope.
struct Handle {
  hid_t id;
  herr_t (*close)(hid_t);
  Handle(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  ~Handle() {
    if (id >= 0) close(id);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  operator hid_t() const { return id; }
};

// Integer attributes of a file or object: the write returns HDF5's status (< 0: failed), the
// read -1 when the attribute is missing or unreadable.
inline herr_t write_scalar_attr(hid_t obj, const char* name, int64_t value) {
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attr(H5Acreate2(obj, name, H5T_NATIVE_INT64, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  return attr < 0 ? attr : H5Awrite(attr, H5T_NATIVE_INT64, &value);
}

inline int64_t read_scalar_attr(hid_t obj, const char* name) {
  if (H5Aexists(obj, name) <= 0) return -1;
  Handle attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  int64_t v = -1;
  if (H5Aread(attr, H5T_NATIVE_INT64, &v) < 0) return -1;
  return v;
}

}  // namespace pipetrain
