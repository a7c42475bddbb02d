// What started this process: srun (SLURM_* variables) or mpiexec / a direct start. Logged at
// start so a job's output says which job, nodes and layout it ran; the local rank picks the GPU
// in the GPU build.
#pragma once
#include <string>

namespace pipetrain {

struct LaunchInfo {
  bool slurm = false;
  std::string job_id, node_list, host;
  int procid = -1, ntasks = -1, localid = -1, restart_count = 0;
  bool in_step = false;  // inside an srun job step (SLURM_STEP_ID set)
  // PIPETRAIN_SPARE_NODES: how many nodes the job script could requeue the job without (its node
  // range above the minimum, idle nodes to replace one); -1 when the launcher does not say.
  int spare_nodes = -1;

  static LaunchInfo from_environment();
  std::string describe() const;  // one line for the log
};

// Memory this process's node lets it use: physical memory, or less where a cgroup limit
// (Slurm's --mem, a container) says so.
double node_memory_bytes();

}  // namespace pipetrain
