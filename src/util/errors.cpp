#include "pipetrain/util/errors.hpp"

#include <cstdio>

namespace pipetrain {

void report_error(const std::string& message) {
  std::fprintf(stderr, "pipetrain: error: %s\n", message.c_str());
  std::fflush(stderr);
}

void report_fault(const std::string& message) {
  std::fprintf(stderr, "pipetrain: fault: %s\n", message.c_str());
  std::fflush(stderr);
}

void report(ExitCode code, const std::string& message) {
  code == ExitCode::bad_input ? report_error(message) : report_fault(message);
}

}  // namespace pipetrain
