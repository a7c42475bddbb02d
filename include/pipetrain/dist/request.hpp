// A nonblocking message or collective in flight, as Comm starts it and waits for it. It carries
// MPI's request without naming MPI, so the layers above dist need no <mpi.h> and cannot call MPI.
#pragma once
#include <cstdint>

namespace pipetrain {

class Request {
 public:
  Request() = default;  // none: waiting for it returns at once
  bool active() const { return active_; }

 private:
  friend struct MpiHandles;   // dist's access (src/dist/mpi_handles.hpp)
  std::uint64_t handle_ = 0;  // an MPI_Request's bytes: an int in MPICH, a pointer in Open MPI
  bool active_ = false;
};

}  // namespace pipetrain
