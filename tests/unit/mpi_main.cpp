// The Catch2 runner for tests that need real MPI ranks (CTest starts it under mpiexec -n 2): every
// rank runs every test case in the same order, so their collectives meet; a failure on any rank
// fails the run.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "pipetrain/dist/comm.hpp"

int main(int argc, char** argv) {
  pipetrain::Comm::init(&argc, &argv);
  const int failed = Catch::Session().run(argc, argv);
  pipetrain::Comm::finalize(failed ? 1 : 0);
  return failed ? 1 : 0;
}
