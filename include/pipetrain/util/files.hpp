// Whole-file reads of user inputs and crash-safe whole-file writes, shared by the spec, data,
// checkpoint, metrics and trace code.
#pragma once
#include <cstdint>
#include <string>

namespace pipetrain {

// The whole content of a regular file; anything else (missing, a directory, unreadable, larger
// than max_bytes) is a SpecError "<what>: cannot read <path> (<reason>)".
std::string read_input_file(const std::string& path, const std::string& what, size_t max_bytes = SIZE_MAX);

// Marks a run directory (created if missing) as in use while this object lives: an fcntl write
// lock on DIR/.lock, which the kernel drops when the process ends however it ends (SIGKILL, OOM),
// so a stale file never blocks a resume. The file says who holds it, for the message a second
// run gets (a SpecError). On file systems without locks it warns and does not lock. A directory
// the lock created and nothing else wrote to (a start refused) is removed with the lock.
class RunDirLock {
 public:
  explicit RunDirLock(const std::string& dir);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
  std::string dir_;
  bool created_ = false;  // the directory did not exist before this lock
};

// Replaces `path` with `text` atomically: path.tmp, fsync, rename, fsync of the folder, so a crash
// leaves either the old or the new file, never a half-written one. Throws std::runtime_error.
void write_file_atomically(const std::string& path, const std::string& text);

// "12.0 MiB free of 3.0 GiB" for the file system holding `path` (for error messages: HDF5
// reports a failed write without the errno, and a full disk or quota is the usual cause).
std::string free_space_note(const std::string& path);

// fsync a file or directory (so a rename that follows cannot overtake its contents on a crash).
void sync_path(const std::string& path);

// "12.3 MiB": bytes in binary units, one decimal ("512 B" below a KiB).
std::string human_bytes(double bytes);

}  // namespace pipetrain
