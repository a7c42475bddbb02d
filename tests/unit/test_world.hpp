// The MPI world of the MPI unit-test runner (mpi_main.cpp), for test cases that need real ranks.
#pragma once
#include "pipetrain/dist/world.hpp"

pipetrain::World& test_world();
