// dist's own MPI plumbing, not visible above dist: Request's MPI handle, and the one polling loop.
#pragma once
#include <mpi.h>

#include <cstring>

#include "pipetrain/dist/request.hpp"
#include "pipetrain/dist/world.hpp"

namespace pipetrain {

static_assert(sizeof(MPI_Request) <= sizeof(std::uint64_t), "Request holds an MPI_Request");

struct MpiHandles {
  static MPI_Request get(const Request& r) {
    MPI_Request m = MPI_REQUEST_NULL;
    if (r.active_) std::memcpy(&m, &r.handle_, sizeof m);
    return m;
  }
  static Request make(MPI_Request m) {
    Request r;
    r.active_ = m != MPI_REQUEST_NULL;
    std::memcpy(&r.handle_, &m, sizeof m);
    return r;
  }
};

// Lets an MPI call fill a Request as it fills an MPI_Request: MPI_Ibarrier(comm, RequestOut(r)).
// The handle is copied into `r` when the call's statement ends.
class RequestOut {
 public:
  explicit RequestOut(Request& r) : r_(r) {}
  ~RequestOut() { r_ = MpiHandles::make(m_); }
  RequestOut(const RequestOut&) = delete;
  RequestOut& operator=(const RequestOut&) = delete;
  operator MPI_Request*() { return &m_; }

 private:
  Request& r_;
  MPI_Request m_ = MPI_REQUEST_NULL;
};

// Polls `req` with MPI_Test until it completes (true) or `timeout_s` passes (false), adding the
// time spent to `waited`. yield gives the core away between polls (ranks outnumber cores).
// `pending`, when given, says whether the first test found it incomplete.
bool poll_until_done(MPI_Request& req, WaitMode mode, double timeout_s, double& waited, bool* pending = nullptr);
// The same for a Request (inactive once complete).
inline bool poll_until_done(Request& req, WaitMode mode, double timeout_s, double& waited, bool* pending = nullptr) {
  MPI_Request m = MpiHandles::get(req);
  const bool done = poll_until_done(m, mode, timeout_s, waited, pending);
  req = MpiHandles::make(m);
  return done;
}

}  // namespace pipetrain
