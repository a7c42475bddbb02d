// The process's World on two real ranks (mpiexec -n 2): agreements of all ranks and their bounds;
// Comm's clock comparison with rank 0.
#include <catch2/catch.hpp>

#include <cmath>

#include "pipetrain/dist/comm.hpp"
#include "pipetrain/dist/world.hpp"
#include "pipetrain/util/clock.hpp"
#include "test_world.hpp"

using namespace pipetrain;

TEST_CASE("world: a failure on one rank ends the step on every rank with the same code", "[world][mpi]") {
  World& world = test_world();
  REQUIRE(world.size() == 2);
  CHECK(world.run_agreed([] {}) == ExitCode::ok);
  // Bad input on rank 1 alone: both ranks return bad_input (only rank 1 printed the message).
  CHECK(world.run_agreed([&] {
    if (world.rank() == 1) throw SpecError("rank 1 read a bad spec (expected by the test)");
  }) == ExitCode::bad_input);
  // Bad input beats a fault: the most severe code wins, the lowest failing rank speaks.
  const World::Failure f = world.first_failure(world.rank() == 0 ? ExitCode::fault : ExitCode::bad_input);
  CHECK(f.rank == 0);
  CHECK(f.code == ExitCode::bad_input);
  CHECK_THROWS_AS(world.require_agreed([&] {
    if (world.rank() == 0) throw std::runtime_error("rank 0 broke (expected by the test)");
  }),
                  AgreedExit);
}

TEST_CASE("world: a save's longer agreement bound holds for its scope only", "[world][mpi]") {
  World& world = test_world();
  world.bound_agreements(5, "a step agreement");
  {
    World::LongerAgreements saving(world, 42, "a checkpoint save");
    CHECK(world.agreement_bound_s() == 42);
  }
  CHECK(world.agreement_bound_s() == 5);
  world.bound_agreements(World::kStartupAgreementS, "start-up");
}

TEST_CASE("world: every rank's host is known, and where() names it", "[world][mpi]") {
  World& world = test_world();
  REQUIRE(world.hosts().size() == 2);
  CHECK(world.where(1) == "rank 1 on " + world.hosts()[1]);
  CHECK(world.local_ranks() >= 1);
  CHECK(world.cores_per_rank() >= 1);
}

TEST_CASE("comm: a rank's clock offset to rank 0 is found within its error bound", "[comm][mpi]") {
  World& world = test_world();
  Comm comm(world, Topology::of(world.rank(), 2, 1), WaitPolicy::automatic, 30);
  // Rank 1's clock runs 5 s ahead of rank 0's (both read one steady clock on one machine): adding
  // -5 s to it reads rank 0's.
  const double skew = world.rank() == 1 ? 5.0 : 0.0;
  const Comm::ClockOffset c = comm.clock_offset_to_root(8, [&] { return now_s() + skew; });
  if (world.rank() == 0) {
    CHECK(c.offset_s == 0);
    CHECK(c.error_s == 0);
  } else {
    CHECK(c.error_s > 0);
    CHECK(c.error_s < 0.05);
    CHECK(std::abs(c.offset_s + 5.0) <= c.error_s + 1e-9);
  }
  CHECK(comm.broadcast_from_root(world.rank() == 0 ? 42.0 : -1.0) == 42.0);
}
