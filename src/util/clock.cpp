#include "pipetrain/util/clock.hpp"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace pipetrain {

double process_started_unix() {
  // /proc/self/stat's 22nd field: the start in clock ticks since boot; /proc/uptime: now since boot.
  std::ifstream stat("/proc/self/stat"), uptime("/proc/uptime");
  std::string text;
  double up = 0;
  if (!std::getline(stat, text) || !(uptime >> up)) return wall_clock_s();
  std::istringstream fields(text.substr(text.rfind(')') + 2));  // after the command name, which may hold spaces
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
  }
  const double ticks = std::strtod(field.c_str(), nullptr);
  const double ran_s = up - ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
  return wall_clock_s() - (ran_s > 0 ? ran_s : 0);
}

}  // namespace pipetrain
