// The output rule every writing command keeps (check_output, AtomicOutput): what it refuses, that
// a refusal leaves everything as it was, and what --force may replace.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "pipetrain/util/atomic_output.hpp"
#include "pipetrain/util/errors.hpp"
#include "temp_dir.hpp"

namespace fs = std::filesystem;
using namespace pipetrain;

namespace {

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A rule whose own kind is a file starting with "OWN".
OutputRule rule(std::vector<std::string> inputs, bool force) {
  return {"test",
          "--output",
          "an own file",
          [](const std::string& p) { return fs::is_regular_file(p) && read(p).rfind("OWN", 0) == 0; },
          std::move(inputs),
          force};
}

std::string refusal(const std::string& path, const OutputRule& r) {
  try {
    check_output(path, r);
  } catch (const SpecError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("output rule: an input is never the output, however it is spelled") {
  TempDir t;
  const std::string in = t.write("text.txt", "the user's text");
  fs::create_symlink(in, t.dir / "link.txt");
  fs::create_hard_link(in, t.dir / "hard.txt");
  for (const std::string& out :
       {in, (t.dir / "." / "text.txt").string(), (t.dir / "link.txt").string(), (t.dir / "hard.txt").string()}) {
    const std::string why = refusal(out, rule({in}, true));
    CHECK(why.find("is the input " + in) != std::string::npos);
  }
  // The folder holding an input is refused too, even where it would otherwise be replaceable.
  CHECK(refusal(t.dir.string(), rule({in}, true)).find("holds the input " + in) != std::string::npos);
  CHECK(refusal(t.dir.string() + "/", rule({in}, true)).find("holds the input") != std::string::npos);
  CHECK(read(in) == "the user's text");
}

TEST_CASE("output rule: checkpoints, checkpoints folders and run directories are never outputs") {
  TempDir t;
  const fs::path run = t.dir / "run", ckpts = run / "checkpoints", step = ckpts / "step_00000010";
  fs::create_directories(step);
  t.write("run/config.toml", "[run]\n");
  t.write("run/metrics.jsonl", "{}\n");
  t.write("run/checkpoints/latest", "step_00000010\n");
  t.write("run/checkpoints/step_00000010/manifest.json", "{}");
  CHECK(refusal(step.string(), rule({}, true)).find("is a pipetrain checkpoint") != std::string::npos);
  CHECK(refusal(ckpts.string(), rule({}, true)).find("is a run's checkpoints folder") != std::string::npos);
  CHECK(refusal(run.string(), rule({}, true)).find("is a pipetrain run directory") != std::string::npos);
  // Nothing is added inside a checkpoint either; a run directory may hold outputs (its plots).
  CHECK(refusal((step / "model.bin").string(), rule({}, true)).find("lies inside") != std::string::npos);
  CHECK(refusal((ckpts / "x").string(), rule({}, true)).find("lies inside") != std::string::npos);
  CHECK(refusal((run / "plots.bin").string(), rule({}, true)).empty());
}

TEST_CASE("output rule: --force replaces only what the command writes") {
  TempDir t;
  const std::string own = t.write("own.bin", "OWN data"), other = t.write("other.bin", "the user's data");
  fs::create_directories(t.dir / "folder");
  t.write("folder/notes.txt", "keep");
  CHECK(refusal(own, rule({}, false)).find("already exists (pass --force") != std::string::npos);
  CHECK(refusal(own, rule({}, true)).empty());
  CHECK(refusal(other, rule({}, true)).find("is a file, not an own file") != std::string::npos);
  CHECK(refusal((t.dir / "folder").string(), rule({}, true)).find("is a folder, not an own file") != std::string::npos);
  fs::create_symlink(t.dir / "nowhere", t.dir / "dangling");
  CHECK(refusal((t.dir / "dangling").string(), rule({}, true)).find("dangling") != std::string::npos);
  CHECK(refusal((t.dir / "new.bin").string(), rule({}, false)).empty());
}

TEST_CASE("output rule: a refused AtomicOutput creates nothing, a committed one replaces its own kind") {
  TempDir t;
  const std::string other = t.write("other.bin", "the user's data"), own = t.write("own.bin", "OWN old");
  CHECK_THROWS_AS(AtomicOutput(other, rule({}, true)), SpecError);
  CHECK_THROWS_AS(AtomicOutput((t.dir / "sub" / "x").string(), rule({(t.dir / "sub" / "x").string()}, true)),
                  SpecError);
  CHECK(!fs::exists(t.dir / "sub"));  // refused before its folder was made
  {
    AtomicOutput out(own, rule({}, true));
    std::ofstream(out.staging()) << "OWN new";
    out.commit();
  }
  {
    AtomicOutput abandoned(own, rule({}, true));
    std::ofstream(abandoned.staging()) << "OWN never";
  }
  CHECK(read(own) == "OWN new");
  CHECK(read(other) == "the user's data");
  size_t files = 0;
  for (auto& e : fs::directory_iterator(t.dir)) files += e.is_regular_file();
  CHECK(files == 2);  // no staging or set-aside file left
}
