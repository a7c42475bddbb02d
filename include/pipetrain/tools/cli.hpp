// What every subcommand shares: its options parsed (boost::program_options, as `pipetrain <command>
// --help` shows them), and how it runs and ends: in one process without MPI (run_offline), or as an
// MPI job whose ranks end together (run_mpi). Each command's own file parses its options with these;
// src/main.cpp only dispatches.
#pragma once
#include <boost/program_options.hpp>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "pipetrain/dist/world.hpp"
#include "pipetrain/util/errors.hpp"

namespace pipetrain {

namespace po = boost::program_options;

// Parses a subcommand's arguments. Returns nothing to go on, else how the command ends: ok after
// --help, bad_input (with one message) for bad arguments.
std::optional<ExitCode> parse_command_line(const char* cmd, const po::options_description& desc,
                                           const std::vector<std::string>& args, po::variables_map& vm,
                                           const po::positional_options_description& pos = {});
// Runs a command that needs no MPI: bad input (SpecError) and any other failure end it with one
// message and their code.
ExitCode run_offline(const std::function<ExitCode()>& body);
// Whether `pipetrain CMD ARGS...` computes, and so settles its BLAS kernels first (a check that
// may restart the process): not plan without --calibrate, which only predicts, nor train when it
// only prints (--print-spec, --print-run-dir, --spec-reference, --help).
bool command_computes(const std::string& cmd, const std::vector<std::string>& args);
// Runs an MPI command: the world starts, the command runs, the world ends; a fault tears the job
// down instead of leaving peers waiting.
ExitCode run_mpi(const std::function<ExitCode(World&)>& body);

}  // namespace pipetrain
