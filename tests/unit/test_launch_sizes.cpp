// The job plan --auto --sbatch prints: node ranges as sbatch takes them, the time limit asked of
// Slurm, and a line the shell reads back word for word.
#include <catch2/catch.hpp>

#include "pipetrain/planner/launch_sizes.hpp"

using namespace pipetrain;

TEST_CASE("node ranges: --nodes takes one count or MIN-MAX, anything else is named", "[planner]") {
  const NodeRange one = parse_node_range("4"), range = parse_node_range("2-8");
  CHECK((one.min == 4 && one.max == 4));
  CHECK((range.min == 2 && range.max == 8));
  for (const char* bad : {"", "0", "-3", "2-", "8-2", "two", "2-8-9", "3x"})
    CHECK_THROWS_WITH(parse_node_range(bad), Catch::Contains(std::string("--nodes ") + bad));
}

TEST_CASE("the time limit: the predicted run, a quarter more and 10 minutes, in whole minutes", "[planner]") {
  CHECK(slurm_time_limit(0) == "0:10:00");
  CHECK(slurm_time_limit(3600) == "1:25:00");          // 75 + 10 minutes
  CHECK(slurm_time_limit(3601) == "1:26:00");          // a started minute counts
  CHECK(slurm_time_limit(2 * 86400) == "2-12:10:00");  // past a day: days-hours
}

TEST_CASE("the sbatch line: the user's overrides quoted for the shell, then the layout's", "[planner]") {
  LayoutChoice pick;
  pick.spec.run.steps = 100;
  pick.predicted.step_s = 36;  // 3600 s of training
  pick.sets = "--set parallel.pp=2 --set parallel.dp=4";
  const JobRequest job{"configs/my run.toml", {"run.name=a b", "train.lr=3e-4", "run.note=it's"}, 4};
  CHECK(sbatch_line(job, 2, pick) ==
        "sbatch --nodes=2 --ntasks-per-node=4 --time=1:25:00 jobs/train.sbatch --config 'configs/my run.toml' "
        "--set 'run.name=a b' --set train.lr=3e-4 --set 'run.note=it'\\''s' --set parallel.pp=2 --set parallel.dp=4");
}
