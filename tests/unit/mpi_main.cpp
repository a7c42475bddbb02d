// The Catch2 runner for tests that need real MPI ranks (CTest starts it under mpiexec -n 2): every
// rank runs every test case in the same order, so their collectives meet; a failure on any rank
// fails the run.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "pipetrain/dist/world.hpp"
#include "test_world.hpp"

namespace {
pipetrain::World* g_world = nullptr;
}

pipetrain::World& test_world() { return *g_world; }

int main(int argc, char** argv) {
  pipetrain::World world(&argc, &argv);
  g_world = &world;
  const int failed = Catch::Session().run(argc, argv);
  world.finalize(failed ? pipetrain::ExitCode::fault : pipetrain::ExitCode::ok);
  return failed ? 1 : 0;
}
