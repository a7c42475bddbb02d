"""Python helpers shared by the integration tests, drills and benchmarks: run with the repository
root as the working directory, e.g. python3 -m tests.drills.node_drill."""
