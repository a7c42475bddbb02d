#include "pipetrain/pipeline/expert_group.hpp"

#include <numeric>

#include "pipetrain/compute/device.hpp"
#include "pipetrain/compute/profile.hpp"
#include "pipetrain/util/clock.hpp"

namespace pipetrain {

void CommExpertGroup::all_to_all(const int* send, int* recv, int n) {
  KernelTimer timer(Kernel::ep_comm);
  const double t0 = now_s();
  comm_.alltoall_expert(send, recv, n);
  spans_.push_back({"ep all-to-all (row counts)", t0, now_s()});
}

void CommExpertGroup::all_to_all(const float* send, const std::vector<int>& send_counts, float* recv,
                                 const std::vector<int>& recv_counts) {
  KernelTimer timer(Kernel::ep_comm);
  const double t0 = now_s();
  if (compute_device() != Device::gpu) {
    comm_.alltoall_expert(send, send_counts, recv, recv_counts);
  } else {  // MPI moves host memory: the rows go through host copies
    sent_.resize(std::accumulate(send_counts.begin(), send_counts.end(), size_t{0}));
    received_.resize(std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0}));
    download(sent_.data(), send, sizeof(float) * sent_.size());
    comm_.alltoall_expert(sent_.data(), send_counts, received_.data(), recv_counts);
    upload(recv, received_.data(), sizeof(float) * received_.size());
  }
  spans_.push_back({"ep all-to-all (token rows)", t0, now_s()});
}

}  // namespace pipetrain
