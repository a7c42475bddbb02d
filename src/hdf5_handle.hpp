// What every HDF5 user in pipetrain shares: HDF5 kept quiet (we report errors ourselves, naming
// the file) and kept from cleaning up at exit, and a scope guard for its handles.
#pragma once
#include <hdf5.h>

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

}  // namespace pipetrain
