#include "pipetrain/launch.hpp"

#include <unistd.h>

#include <cstdlib>

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

}  // namespace

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
  return l;
}

std::string LaunchInfo::describe() const {
  if (!slurm) return "launched outside Slurm on " + host;
  return "Slurm job " + job_id + " (restart " + std::to_string(restart_count) + ") on nodes " + node_list + ", " +
         std::to_string(ntasks) + " tasks";
}

}  // namespace pipetrain
