// How a pipetrain command ends: the exit codes users and job scripts act on, and the exceptions
// that carry a failure up to the one place that prints it and turns it into a code (the command's
// entry point, or an agreement of all ranks during start-up).
#pragma once
#include <exception>
#include <stdexcept>
#include <string>

namespace pipetrain {

// jobs/train.sbatch requeues on `stopped`, never on `bad_input`, and on `fault` after probing
// the allocation's nodes.
enum class ExitCode : int {
  ok = 0,
  fault = 1,      // something broke while running: a lost peer, a failed final save, NaN steps
  bad_input = 2,  // spec, CLI, data file, checkpoint or run directory: one message naming it
  stopped = 3,    // a stop signal or the time budget: a checkpoint was saved, resume continues
};
inline int code(ExitCode c) { return static_cast<int>(c); }

// Bad input: printed as one line naming the key or file, exit code 2.
struct SpecError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Every rank agreed to end the command with this code; the message (if any) was already printed
// once, by the rank that hit the problem.
struct AgreedExit : std::exception {
  explicit AgreedExit(ExitCode c) : code(c) {}
  ExitCode code;
  const char* what() const noexcept override { return "all ranks agreed to exit"; }
};

// The one way a failure reaches the user: one line on stderr. "error": what the user can fix or
// must decide on (bad input, a run that cannot go on: NaN steps, a lost final save); "fault": the
// machinery broke (a lost peer, an unexpected exception).
void report_error(const std::string& message);
void report_fault(const std::string& message);
// The report a command's failure gets: bad input is an error, the rest a fault.
void report(ExitCode code, const std::string& message);

}  // namespace pipetrain
