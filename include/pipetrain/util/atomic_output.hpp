// Writing an output file or folder (an exported model, a token file, a cost file, plots) so that
// it appears whole or not at all, and never in place of anything the user did not ask to replace.
//
// The output rule, kept by every command that writes: before anything is read, check_output
// refuses (bad input, exit 2) an output that is one of the command's inputs or holds one, that is
// or lies in a checkpoint, that is a run directory, that exists without --force, or that exists
// but is not what the command itself writes (--force replaces a token file with a token file,
// never a folder of the user's). Then everything goes to a staging path next to the output (same
// file system, so the final rename is atomic), is fsynced, and is renamed into place only when
// complete. A failure before commit() removes the staging path and leaves what was at the output
// before untouched. Replacing a folder takes two renames (the old one aside, the new one in): a
// crash between them leaves the old output as OUT.old-PID.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace pipetrain {

// What a command writes at one output, and what it reads: the facts check_output judges by.
struct OutputRule {
  std::string command;              // "data import", for messages
  std::string option = "--output";  // how the user named the output, for messages
  std::string kind;                 // what the command writes there: "a token file"
  // Whether what exists at a path (symlinks followed) is of `kind`, so that --force may replace
  // it: a look at its head or its names, never more.
  std::function<bool(const std::string& path)> is_own;
  std::vector<std::string> inputs;  // the files and folders the command reads
  bool force = false;               // --force: replace an existing output of `kind`
};

// Refuses to write `path` with a SpecError naming it (and the input or the kind) when it:
//  - is one of rule.inputs (the same file or folder, by inode, however it is spelled) or a folder
//    holding one;
//  - is a checkpoint (a folder with manifest.json), a run's checkpoints folder, a run directory,
//    or lies inside a checkpoint or a checkpoints folder;
//  - exists, without rule.force;
//  - exists but rule.is_own says it is not rule.kind.
void check_output(const std::string& path, const OutputRule& rule);

// Whether `dir` is a folder holding only regular files that `allowed(name)` accepts (an empty folder
// too): how a command tells a folder it wrote from one of the user's.
bool folder_holds_only(const std::string& dir, const std::function<bool(const std::string& name)>& allowed);

// The checkpoint, checkpoints folder or run directory `dir` is ("a pipetrain checkpoint"), or ""
// for any other path: by the names the run directory's layout gives them (docs/design.md).
std::string protected_folder_kind(const std::string& dir);

class AtomicOutput {
 public:
  // check_output(path, rule), then a staging path beside it; the output's folder is created when
  // missing (SpecError naming it when it cannot be).
  AtomicOutput(const std::string& path, const OutputRule& rule);
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
