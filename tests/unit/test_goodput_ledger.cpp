// The goodput ledger (tools/goodput_ledger.hpp): a run's wall-clock split launch by launch, with
// Slurm's starts where sacct gives them, on records written here by hand.
#include <catch2/catch.hpp>

#include "pipetrain/tools/goodput_ledger.hpp"

using namespace pipetrain;
using json = nlohmann::json;

namespace {

json totals(double steps, double ckpt, double eval) {
  return {{"steps_s", steps}, {"checkpoint_s", ckpt}, {"eval_s", eval}};
}

// Launch 1 (job 7): process at 100, launch record at 102, stop record at 150 after 40 s of steps,
// 3 s of saves, 1 s of evaluation. Launch 2 (job 7, requeued): process at 170, record at 171,
// killed: its last line at 200 with 25 s of steps, 10 s of them (12 steps) computed again by
// launch 3. Launch 3 (job 7): process at 230, record at 231, stop at 260 with 28 s of steps.
std::vector<json> events() {
  return {
      {{"event", "launch"}, {"launch", 1}, {"job_id", "7"}, {"unix", 102.0}, {"process_unix", 100.0}},
      {{"event", "stop"}, {"launch", 1}, {"unix", 150.0}, {"launch_totals", totals(40, 3, 1)}},
      {{"event", "launch"}, {"launch", 2}, {"job_id", "7"}, {"unix", 171.0}, {"process_unix", 170.0}},
      {{"event", "launch"},
       {"launch", 3},
       {"job_id", "7"},
       {"unix", 231.0},
       {"process_unix", 230.0},
       {"lost_before",
        {{"launch", 2}, {"steps", 12}, {"steps_s", 10.0}, {"last_time", 200.0}, {"launch_totals", totals(25, 0, 0)}}}},
      {{"event", "stop"}, {"launch", 3}, {"unix", 260.0}, {"launch_totals", totals(28, 0, 0)}}};
}

std::vector<json> metrics() {
  return {{{"step", 10}, {"launch", 1}, {"time", 120.0}, {"launch_totals", totals(15, 0, 0)}},
          {{"step", 20}, {"launch", 2}, {"time", 185.0}, {"launch_totals", totals(12, 0, 0)}},
          {{"step", 30}, {"launch", 3}, {"time", 250.0}, {"launch_totals", totals(20, 0, 0)}}};
}

}  // namespace

TEST_CASE("ledger: each launch split into its parts, the steps a later launch redid counted lost", "[ledger]") {
  const Ledger l = goodput_ledger(events(), metrics(), 1.25);
  REQUIRE(l.launches.size() == 3);
  const LedgerLaunch &a = l.launches[0], &b = l.launches[1], &c = l.launches[2];
  CHECK(a.start == 100);
  CHECK(a.end == 150);
  CHECK(a.stopped);
  CHECK(a.startup_s == Approx(2));
  CHECK(a.training_s == Approx(40));
  CHECK(a.checkpoint_s == Approx(3));
  CHECK(a.eval_s == Approx(1));
  CHECK(a.other_s == Approx(48 - 44));
  // Launch 2 had no stop record: it ends at the last line its successor cut, with that line's totals.
  CHECK_FALSE(b.stopped);
  CHECK(b.end == 200);
  CHECK(b.lost_steps == 12);
  CHECK(b.lost_s == Approx(10));
  CHECK(b.training_s == Approx(15));
  CHECK(b.other_s == Approx(29 - 25));
  CHECK(c.training_s == Approx(28));
  // Without Slurm: the gaps between launches are outside them, and nothing is left over.
  CHECK(l.wall_s == Approx(160));
  CHECK(l.between_s == Approx(20 + 30));
  CHECK(l.unaccounted_s == Approx(0).margin(1e-9));
  CHECK(l.slurm == "no Slurm job");
}

TEST_CASE("ledger: Slurm's starts give each launch its queue and job-script time", "[ledger]") {
  // Job 7 submitted at 90, started at 95; a start at 152 that grew and ran nothing until 160; the
  // launch-2 start from 165 (submitted at 160) to 215 (the fault's timeout); the last from 225 to 263.
  const std::vector<SlurmAttempt> starts = {{"7", "REQUEUED", 90, 95, 152},
                                            {"7", "REQUEUED", 152, 155, 160},
                                            {"7", "REQUEUED", 160, 165, 215},
                                            {"7", "COMPLETED", 215, 225, 263}};
  const Ledger l = goodput_ledger(events(), metrics(), 1.25, starts);
  REQUIRE(l.launches.size() == 3);
  CHECK(l.slurm == "sacct");
  CHECK(l.slurm_starts == 4);
  CHECK(l.unlaunched == 1);
  CHECK(l.unlaunched_s == Approx(8));
  CHECK(l.launches[0].queue_s == Approx(5));
  CHECK(l.launches[0].script_s == Approx(5 + 2));  // 95 to the process at 100, its stop at 150 to 152
  CHECK(l.launches[1].queue_s == Approx(5));
  CHECK(l.launches[1].script_s == Approx(5 + 15));  // the dead rank's timeout after its last line
  CHECK(l.launches[2].queue_s == Approx(10));
  CHECK(l.launches[2].script_s == Approx(5 + 3));
  CHECK(l.wall_s == Approx(263 - 90));
  CHECK(l.between_s == Approx(0));
  CHECK(l.unaccounted_s == Approx(0).margin(1e-9));
  const json j = to_json(l);
  CHECK(j["total"]["queue_s"].get<double>() == Approx(20));
  CHECK(j["starts_without_launch"] == 1);
  CHECK(describe(l).find("starts without a launch (1) 8.0 s") != std::string::npos);
}

TEST_CASE("ledger: a start sacct lost leaves its launch whole and its queue with the gaps", "[ledger]") {
  // The start that ran launch 1 is missing: sacct shows job 7 queued from 90 to 155 (seen when
  // slurmctld requeued a job for a node failure itself).
  const std::vector<SlurmAttempt> starts = {
      {"7", "REQUEUED", 90, 155, 160}, {"7", "REQUEUED", 160, 165, 215}, {"7", "COMPLETED", 215, 225, 263}};
  const Ledger l = goodput_ledger(events(), metrics(), 1.25, starts);
  CHECK(l.starts_lost == 1);
  CHECK(l.unlaunched == 0);
  CHECK(l.launches[0].queue_s == 0);
  CHECK(l.launches[0].script_s == Approx(160 - 150));
  CHECK(l.between_s == Approx(100 - 90));
  CHECK(l.launches[1].queue_s == Approx(5));
  CHECK(l.wall_s == Approx(263 - 90));
  CHECK(l.unaccounted_s == Approx(0).margin(1e-9));
  CHECK(describe(l).find("sacct lost 1 start(s)") != std::string::npos);
}

TEST_CASE("ledger: sacct's lines read as the starts they are", "[ledger]") {
  SlurmAttempt a;
  REQUIRE(parse_attempt("12|2026-12-06T09:36:22|2026-12-06T09:36:23|2026-12-06T09:36:26|REQUEUED", a));
  CHECK(a.job_id == "12");
  CHECK(a.state == "REQUEUED");
  CHECK(a.start - a.submit == 1);
  CHECK(a.end - a.start == 3);
  CHECK_FALSE(parse_attempt("12|2026-12-06T09:36:22|Unknown|Unknown|PENDING", a));
  CHECK_FALSE(parse_attempt("JobIDRaw|Submit|Start|End|State", a));
}
