// Writing an output file or folder (an exported model, a token file) so that it appears whole or
// not at all: everything goes to a staging
// path next to the output (same file system, so the final rename is atomic), is fsynced, and is
// renamed into place only when complete. A failure before commit() removes the staging path and
// leaves what was at the output before untouched. Replacing a folder takes two renames (the old
// one aside, the new one in): a crash between them leaves the old output as OUT.old-PID.
#pragma once
#include <string>

namespace pipetrain {

class AtomicOutput {
 public:
  // `path` must not exist unless `replace` (SpecError naming it and --force); its folder is created
  // when missing (SpecError naming it when it cannot be).
  AtomicOutput(const std::string& path, bool replace);
  ~AtomicOutput();  // not committed: the staging path is removed
  AtomicOutput(const AtomicOutput&) = delete;
  AtomicOutput& operator=(const AtomicOutput&) = delete;

  const std::string& staging() const { return staging_; }  // write the file (or make the folder) here
  // Syncs the staging path and renames it to the output, replacing what was there, then syncs the
  // folder. The files inside a staged folder must have been synced by their writers.
  void commit();

 private:
  std::string path_, staging_;
  bool committed_ = false;
};

}  // namespace pipetrain
