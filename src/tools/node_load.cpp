#include "pipetrain/tools/node_load.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "pipetrain/util/clock.hpp"

namespace fs = std::filesystem;

namespace pipetrain {
namespace {

double ticks_per_s() { return static_cast<double>(sysconf(_SC_CLK_TCK)); }

// CPU seconds the node's CPUs spent busy since boot: /proc/stat's first line, less idle and iowait.
double node_cpu_s() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  in >> cpu;
  double total = 0, v = 0;
  for (int field = 0; field < 8 && in >> v; ++field)
    if (field != 3 && field != 4) total += v;  // user nice system [idle iowait] irq softirq steal
  return total / ticks_per_s();
}

// A process's name and CPU seconds (user + system) from /proc/PID/stat; false when it is gone.
bool process_cpu(const std::string& pid, std::string& name, double& cpu_s) {
  std::ifstream in("/proc/" + pid + "/stat");
  std::string text;
  if (!std::getline(in, text)) return false;
  const size_t open = text.find('('), close = text.rfind(')');
  if (open == std::string::npos || close == std::string::npos) return false;
  name = text.substr(open + 1, close - open - 1);
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {  // fields 14 and 15: utime, stime
    if (i == 14) utime = std::atof(field.c_str());
    if (i == 15) stime = std::atof(field.c_str());
  }
  cpu_s = (utime + stime) / ticks_per_s();
  return true;
}

// Every process that runs another program than this one, by pid.
std::map<int, std::pair<std::string, double>> other_programs() {
  std::map<int, std::pair<std::string, double>> out;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    const std::string pid = entry.path().filename();
    if (pid.empty() || !std::all_of(pid.begin(), pid.end(), ::isdigit)) continue;
    std::error_code link_ec;
    if (fs::read_symlink(entry.path() / "exe", link_ec) == self) continue;
    std::string name;
    double cpu_s = 0;
    if (process_cpu(pid, name, cpu_s)) out[std::stoi(pid)] = {name, cpu_s};
  }
  return out;
}

}  // namespace

NodeLoad::NodeLoad() : start_s_(now_s()), node_cpu_s_(node_cpu_s()), others_(other_programs()) {
  std::string name;
  process_cpu("self", name, own_cpu_s_);
}

NodeLoad::Busy NodeLoad::finish() const {
  Busy b;
  b.seconds = now_s() - start_s_;
  b.node_cpu_s = node_cpu_s() - node_cpu_s_;
  std::string name;
  process_cpu("self", name, b.own_cpu_s);
  b.own_cpu_s -= own_cpu_s_;
  std::ifstream("/proc/loadavg") >> b.load_average;
  std::vector<std::pair<double, std::string>> used;  // (share of a core, "name (pid N)")
  for (const auto& [pid, now] : other_programs()) {
    const auto before = others_.find(pid);
    const double share =
        (now.second - (before != others_.end() ? before->second.second : 0)) / std::max(b.seconds, 1e-3);
    if (share >= 0.1) used.push_back({share, now.first + " (pid " + std::to_string(pid) + ")"});
  }
  std::sort(used.rbegin(), used.rend());
  for (size_t i = 0; i < used.size() && i < 3; ++i) {
    char pct[48];
    std::snprintf(pct, sizeof pct, " %.0f%%%s", 100 * used[i].first, i == 0 ? " of a core" : "");
    b.busiest_others += (i ? ", " : "") + used[i].second + pct;
  }
  return b;
}

}  // namespace pipetrain
