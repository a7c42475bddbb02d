// The asynchronous checkpoint's moving parts without MPI: a shard file created (HDF5) on this
// thread, its slabs written from a snapshot on a background thread while this thread keeps
// changing the arrays the snapshot was copied from, then read back; and how a background job's
// failures come back. Also built with ThreadSanitizer (scripts/check/sanitize.sh), which would
// report the writer and this thread touching the same memory unsynchronised.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "pipetrain/ckpt/shard_io.hpp"
#include "pipetrain/util/background_job.hpp"
#include "temp_dir.hpp"

using namespace pipetrain;

TEST_CASE("background write: slabs written from another thread read back as the snapshot held them", "[ckpt][async]") {
  TempDir tmp;
  const std::string path = (tmp.dir / "stage_000.h5").string();
  const std::vector<TensorInfo> tensors = {{"wte.weight", {6, 4}}, {"ln.bias", {5}}};
  const std::vector<uint64_t> offsets = create_shard_file(path, tensors, 42);
  REQUIRE(offsets.size() == 6);

  // "Training" arrays: params, exp_avg, exp_avg_sq of both tensors, then a snapshot of them.
  std::vector<std::vector<float>> live;
  for (const TensorInfo& t : tensors)
    for (int k = 0; k < 3; ++k) {
      std::vector<float> a(
          static_cast<size_t>(std::accumulate(t.shape.begin(), t.shape.end(), int64_t{1}, std::multiplies<int64_t>())));
      std::iota(a.begin(), a.end(), 100.0f * static_cast<float>(live.size()));
      live.push_back(a);
    }
  const std::vector<std::vector<float>> snapshot = live;

  // Two replicas' row slabs (rows [0, n0/2) and [n0/2, n0)), written one job after the other.
  for (int replica = 0; replica < 2; ++replica) {
    std::vector<SlabBytes> slabs;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const size_t rows = static_cast<size_t>(tensors[i].shape[0]), row = snapshot[3 * i].size() / rows;
      const size_t r0 = rows * replica / 2, r1 = rows * (replica + 1) / 2;
      for (int k = 0; k < 3; ++k)
        slabs.push_back(
            {offsets[3 * i + k] + r0 * row * sizeof(float), snapshot[3 * i + k].data() + r0 * row, (r1 - r0) * row});
    }
    BackgroundJob job;
    job.start([&] { return write_slabs(path, slabs, 42); });
    while (job.running())  // training goes on: the live arrays change, the snapshot does not
      for (auto& a : live) std::transform(a.begin(), a.end(), a.begin(), [](float x) { return x + 1.0f; });
    CHECK(job.collect().empty());
    CHECK(job.idle());
  }

  ShardReader reader(path);
  CHECK(reader.step() == 42);
  CHECK(reader.format_version() == kCheckpointFormat);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::vector<int> shape(tensors[i].shape.begin(), tensors[i].shape.end());
    const char* groups[] = {"params", "optim/exp_avg", "optim/exp_avg_sq"};
    for (int k = 0; k < 3; ++k) {
      std::vector<float> got(snapshot[3 * i + k].size());
      reader.read(groups[k], tensors[i].name, shape, got.data());
      INFO(groups[k] << "/" << tensors[i].name);
      CHECK(got == snapshot[3 * i + k]);
    }
  }
}

TEST_CASE("background job: a failure or an exception comes back as its message", "[ckpt][async]") {
  BackgroundJob job;
  CHECK(job.idle());
  CHECK(job.collect().empty());  // nothing started: nothing to report
  job.start([] { return std::string("disk full"); });
  CHECK(job.collect() == "disk full");
  job.start([]() -> std::string { throw std::runtime_error("cannot open"); });
  CHECK(job.collect() == "cannot open");
  TempDir tmp;
  const std::string missing = (tmp.dir / "gone.h5").string();
  const float x = 1;
  job.start([&] { return write_slabs(missing, {{0, &x, 1}}, 0); });
  const std::string error = job.collect();
  CHECK(error.find(missing) != std::string::npos);
  CHECK(error.find("cannot open") != std::string::npos);
  CHECK_THROWS_AS(create_shard_file((tmp.dir / "no" / "such" / "dir.h5").string(), {{"a", {1}}}, 0),
                  std::runtime_error);
}
