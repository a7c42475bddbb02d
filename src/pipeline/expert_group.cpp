#include "pipetrain/pipeline/expert_group.hpp"

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
  comm_.alltoall_expert(send, send_counts, recv, recv_counts);
  spans_.push_back({"ep all-to-all (token rows)", t0, now_s()});
}

}  // namespace pipetrain
