#include "pipetrain/tools/slurm_accounting.hpp"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <regex>
#include <sstream>

namespace pipetrain {
namespace {

// sacct's times are the machine's local time, "2026-12-06T09:36:22"; -1 for anything else
// ("Unknown", "None" of a start not yet made or an end not yet reached).
double local_time(const std::string& text) {
  std::tm tm{};
  const char* rest = strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (!rest || *rest) return -1;
  tm.tm_isdst = -1;
  return static_cast<double>(std::mktime(&tm));
}

}  // namespace

bool parse_attempt(const std::string& line, SlurmAttempt& out) {
  std::vector<std::string> f;
  std::istringstream in(line);
  for (std::string field; std::getline(in, field, '|');) f.push_back(field);
  if (f.size() < 5) return false;
  SlurmAttempt a{f[0], f[4], local_time(f[1]), local_time(f[2]), local_time(f[3])};
  if (a.submit < 0 || a.start < 0 || a.end < a.start) return false;
  out = a;
  return true;
}

std::vector<SlurmAttempt> job_attempts(const std::vector<std::string>& job_ids, std::string& why) {
  std::vector<SlurmAttempt> out;
  std::string list;
  static const std::regex job_id("[0-9]+(_[0-9]+)?");
  for (const std::string& id : job_ids)
    if (std::regex_match(id, job_id) && list.find(id) == std::string::npos) list += (list.empty() ? "" : ",") + id;
  if (list.empty()) {
    why = "no Slurm job";
    return out;
  }
  const std::string cmd = "timeout 10 sacct -D -X -n -P -o JobIDRaw,Submit,Start,End,State -j " + list + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    why = "sacct could not be run";
    return out;
  }
  std::string text;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) text += buf;
  const int status = pclose(p);
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    SlurmAttempt a;
    if (parse_attempt(line, a)) out.push_back(a);
  }
  std::sort(out.begin(), out.end(), [](const SlurmAttempt& a, const SlurmAttempt& b) { return a.start < b.start; });
  if (out.empty()) {
    std::string first = text.substr(0, text.find('\n'));
    why = status != 0 ? "sacct: " + (first.empty() ? "exit " + std::to_string(status) : first)
                      : "sacct knows none of the jobs " + list;
  }
  return out;
}

}  // namespace pipetrain
