#pragma once
// Who used a node's CPUs over an interval: the node as a whole (/proc/stat), this process, and the
// busiest processes running another program. smoke reads it to tell a slow rank from a node busy
// with work outside the job.
#include <map>
#include <string>

namespace pipetrain {

class NodeLoad {
 public:
  NodeLoad();  // the interval starts now

  struct Busy {
    double seconds = 0;          // the interval
    double node_cpu_s = 0;       // CPU time all processes of the node used in it (not idle, not waiting for I/O)
    double own_cpu_s = 0;        // this process's
    double load_average = 0;     // the kernel's 1-minute load average at the end
    std::string busiest_others;  // "python3 (pid 812) 99% of a core, stress (pid 90) 45%": up to 3 using 10%+
  };
  // The interval ends now.
  Busy finish() const;

 private:
  double start_s_, node_cpu_s_, own_cpu_s_;
  std::map<int, std::pair<std::string, double>> others_;  // pid -> (name, CPU seconds so far)
};

}  // namespace pipetrain
