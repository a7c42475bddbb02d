#include "pipetrain/tools/ckpt_command.hpp"
#include "pipetrain/tools/cli.hpp"

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "pipetrain/ckpt/manifest.hpp"
#include "pipetrain/ckpt/resume.hpp"
#include "pipetrain/ckpt/shard_io.hpp"
#include "pipetrain/util/files.hpp"
#include "pipetrain/util/text_table.hpp"

namespace fs = std::filesystem;

namespace pipetrain {

ExitCode ckpt_verify(const std::string& path) {
  std::error_code ec;
  if (fs::exists(fs::path(path) / "manifest.json", ec)) {  // one checkpoint
    if (const std::string problem = verify_checkpoint(path); !problem.empty()) throw SpecError(problem);
    const Manifest m = Manifest::read(path);
    std::printf("%s: ok (step %lld, %zu shards match their checksums and the manifest)\n", path.c_str(),
                static_cast<long long>(m.step), m.shards.size());
    return ExitCode::ok;
  }
  // A folder of them: the newest intact one, and the one `latest` names, which a resume or a
  // requeued job would be pointed at.
  const std::string newest = resolve_checkpoint(path, "ckpt verify");
  const fs::path latest = fs::path(newest).parent_path() / "latest";
  std::string named;
  try {
    named = read_input_file(latest.string(), "ckpt verify", 4096);
  } catch (const SpecError&) {
    throw SpecError("ckpt verify: " + latest.string() + " is missing; the newest intact checkpoint is " + newest);
  }
  named.erase(named.find_last_not_of(" \n\r\t") + 1);
  const std::string target = (latest.parent_path() / named).string();
  const std::string problem = named.empty() || named.find('/') != std::string::npos
                                  ? "it names no checkpoint of this folder"
                              : fs::exists(target, ec) ? verify_checkpoint(target)
                                                       : target + " does not exist";
  if (!problem.empty())
    throw SpecError("ckpt verify: " + latest.string() + " names " + (named.empty() ? "nothing" : named) + ": " +
                    problem + "; the newest intact checkpoint is " + newest);
  const Manifest m = Manifest::read(target);
  std::printf("%s: ok (latest names step %lld, %zu shards match their checksums and the manifest)%s\n", target.c_str(),
              static_cast<long long>(m.step), m.shards.size(),
              target == newest ? "" : ("; the newest intact checkpoint is " + newest).c_str());
  return ExitCode::ok;
}

namespace {

// One shard's tensors, a line each in aligned columns; returns their parameters (those of one of
// the three arrays).
uint64_t print_shard_tensors(const std::string& path) {
  uint64_t params = 0;
  ShardReader r(path);
  std::vector<std::vector<std::string>> rows = {{"tensor", "shape", "params", "bytes (x3 with the AdamW moments)"}};
  for (auto& t : r.tensors()) {
    uint64_t n = 1;
    std::string shape;
    for (size_t d = 0; d < t.shape.size(); ++d) {
      n *= t.shape[d];
      shape += (d ? "x" : "") + std::to_string(t.shape[d]);
    }
    params += n;
    rows.push_back({t.name, shape, std::to_string(n), std::to_string(4 * n)});
  }
  std::fputs(text_table(rows, "    ", {2, 3}).c_str(), stdout);
  return params;
}

}  // namespace

ExitCode ckpt_inspect(const std::string& given) {
  // A folder of checkpoints: its newest (inspect reads what the manifest says; verify judges it).
  const std::vector<std::string> named = checkpoints_named_by(given);
  const std::string path = named.empty() ? given : named.front();
  if (path != given)
    std::fprintf(stderr, "ckpt inspect: %s, the newest checkpoint of %s\n", path.c_str(), given.c_str());
  const Manifest m = Manifest::read(path);  // a SpecError naming the file is the command's bad input
  std::ostringstream partition;
  for (size_t i = 0; i < m.partition.size(); ++i) partition << (i ? "," : "") << m.partition[i];
  const std::string chunks = m.virtual_stages > 1 ? ", " + std::to_string(m.virtual_stages) + " chunks per stage" : "";
  std::printf("checkpoint %s\n  step %lld, %lld samples consumed, saved as %s%s (blocks per %sstage %s) in %.2f s\n",
              path.c_str(), static_cast<long long>(m.step), static_cast<long long>(m.samples_consumed),
              grid_text(std::stoi(m.spec_value("parallel.tp")), m.pp, m.dp).c_str(), chunks.c_str(),
              m.virtual_stages > 1 ? "virtual " : "", partition.str().c_str(), m.write_s);
  if (!m.tokens_by_source.empty()) {
    std::printf("  training tokens by source:");
    for (const auto& [name, tokens] : m.tokens_by_source)
      std::printf(" %s %lld", name.c_str(), static_cast<long long>(tokens));
    std::printf("\n");
  }
  uint64_t total_bytes = 0, total_params = 0;
  for (auto& s : m.shards) {
    std::printf("  %s  %llu bytes  checksum %s\n", s.file.c_str(), static_cast<unsigned long long>(s.bytes),
                hex16(s.checksum).c_str());
    total_bytes += s.bytes;
    try {
      total_params += print_shard_tensors(path + "/" + s.file);
    } catch (const std::exception& e) {
      std::printf("    (cannot read: %s)\n", e.what());
    }
  }
  std::printf("  total %llu parameters (+ 2 AdamW moments each), %llu bytes on disk\n",
              static_cast<unsigned long long>(total_params), static_cast<unsigned long long>(total_bytes));
  return ExitCode::ok;
}

ExitCode ckpt_command(const std::vector<std::string>& args) {
  const bool help =
      std::any_of(args.begin(), args.end(), [](const std::string& a) { return a == "--help" || a == "-h"; });
  if (help || args.size() != 2 || (args[0] != "inspect" && args[0] != "verify")) {
    std::fputs(
        "usage: pipetrain ckpt inspect|verify PATH\n"
        "  PATH: a checkpoint (RUN_DIR/checkpoints/step_00000100), or a run directory, its checkpoints folder\n"
        "  or its latest file: inspect shows the newest checkpoint there; verify checks the newest intact one\n"
        "  and the one latest names (exit 2 when latest names a missing or damaged checkpoint)\n",
        help ? stdout : stderr);
    return help ? ExitCode::ok : ExitCode::bad_input;
  }
  return run_offline([&] { return args[0] == "inspect" ? ckpt_inspect(args[1]) : ckpt_verify(args[1]); });
}

}  // namespace pipetrain
