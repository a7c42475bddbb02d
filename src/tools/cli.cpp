#include "pipetrain/tools/cli.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>

#include "pipetrain/dist/signals.hpp"
#include "pipetrain/util/faults.hpp"

namespace pipetrain {

std::optional<ExitCode> parse_command_line(const char* cmd, const po::options_description& desc,
                                           const std::vector<std::string>& args, po::variables_map& vm,
                                           const po::positional_options_description& pos) {
  try {
    po::store(po::command_line_parser(args).options(desc).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::fprintf(stderr, "pipetrain %s: error: %s (see pipetrain %s --help)\n", cmd, e.what(), cmd);
    return ExitCode::bad_input;
  }
  if (!vm.count("help")) return std::nullopt;
  std::cout << desc << "\n";
  return ExitCode::ok;
}

bool command_computes(const std::string& cmd, const std::vector<std::string>& args) {
  auto given = [&](std::initializer_list<const char*> flags) {
    return std::any_of(args.begin(), args.end(), [&](const std::string& a) {
      return std::any_of(flags.begin(), flags.end(), [&](const char* f) { return a == f; });
    });
  };
  if (cmd == "plan") return given({"--calibrate"});
  if (cmd == "train") return !given({"--print-spec", "--print-run-dir", "--spec-reference", "--help", "-h"});
  return cmd == "eval" || cmd == "generate" || cmd == "smoke";
}

ExitCode run_offline(const std::function<ExitCode()>& body) {
  try {
    return body();
  } catch (const SpecError& e) {
    report_error(e.what());
    return ExitCode::bad_input;
  } catch (const std::exception& e) {
    report_fault(e.what());
    return ExitCode::fault;
  }
}

ExitCode run_mpi(const std::function<ExitCode(World&)>& body) {
  test_pause("start");
  install_stop_handlers();  // before MPI_Init: a USR1/TERM during start-up must not kill the rank
  World world(nullptr, nullptr);
  speak_on_signals(world.rank() == 0);
  ExitCode code = ExitCode::fault;
  try {
    code = body(world);
  } catch (const AgreedExit& e) {
    code = e.code;  // every rank agreed; the message was printed once
  } catch (const SpecError& e) {
    // Bad input found by one rank after start-up (an id beyond the token file's vocabulary, met
    // as its window is read): the others are mid-step, so the job ends here, as bad input.
    report_error(e.what());
    world.abort(ExitCode::bad_input);
  } catch (const CommTimeout& e) {
    report_fault(e.what());
    // The other ranks waiting on the same lost peer time out within moments of this one: give
    // them 2 s to say what they waited for before MPI_Abort tears them down.
    std::this_thread::sleep_for(std::chrono::seconds(2));
    world.abort(ExitCode::fault);
  } catch (const std::exception& e) {
    report_fault("rank " + std::to_string(world.rank()) + ": " + e.what());
    world.abort(ExitCode::fault);
  }
  world.finalize(code);
  return code;
}

}  // namespace pipetrain
