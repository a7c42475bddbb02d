// Topology is header-only arithmetic; this file keeps one translation unit per concern.
#include "pipetrain/topology.hpp"
