#include "pipetrain/dist/launch.hpp"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace pipetrain {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

int env_int(const char* name, int fallback) {
  const std::string v = env(name);
  return v.empty() ? fallback : std::atoi(v.c_str());
}

// A cgroup memory limit in bytes (v2 memory.max, v1 memory.limit_in_bytes), or 0 for none.
double cgroup_memory_limit() {
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream f(path);
    std::string v;
    if (f >> v && v != "max") return std::strtod(v.c_str(), nullptr);
  }
  return 0;
}

}  // namespace

double node_memory_bytes() {
  const double physical = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  const double limit = cgroup_memory_limit();
  return limit > 0 && limit < physical ? limit : physical;
}

LaunchInfo LaunchInfo::from_environment() {
  LaunchInfo l;
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  l.host = host;
  l.job_id = env("SLURM_JOB_ID");
  l.slurm = !l.job_id.empty();
  l.node_list = env("SLURM_JOB_NODELIST");
  l.procid = env_int("SLURM_PROCID", -1);
  l.ntasks = env_int("SLURM_NTASKS", -1);
  l.localid = env_int("SLURM_LOCALID", -1);
  l.restart_count = env_int("SLURM_RESTART_COUNT", 0);
  l.in_step = !env("SLURM_STEP_ID").empty();
  l.spare_nodes = env_int("PIPETRAIN_SPARE_NODES", -1);
  return l;
}

std::string LaunchInfo::describe() const {
  if (!slurm) return "launched outside Slurm on " + host;
  return "Slurm job " + job_id + " (restart " + std::to_string(restart_count) + ") on nodes " + node_list + ", " +
         std::to_string(ntasks) + " tasks";
}

}  // namespace pipetrain
