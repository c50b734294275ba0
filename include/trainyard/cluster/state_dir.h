// A daemon's state directory (the head's database, a worker's identity and job spools): private
// to its user (the folder 0700, the files in it 0600: job env vars and output are secrets) and
// owned by one process at a time through an exclusive lock held for the process's life. See
// Note [One owner per state directory] in state_dir.cpp.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace trainyard::cluster {

class StateDir {
 public:
  static constexpr const char* kLockFile = "lock";

  // Creates `path` with mode 0700 (or tightens an existing one to 0700) and takes its lock.
  // InvalidArgumentError naming the holder (what it is, host, pid, start time) when another
  // process holds it; Error when the folder cannot be created or locked. `owner` says what holds
  // it ("trainyard head", "trainyard worker"), for the message a second process gets.
  StateDir(std::filesystem::path path, std::string_view owner);
  ~StateDir();  // releases the lock
  StateDir(const StateDir&) = delete;
  StateDir& operator=(const StateDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;  // the lock file, flock()ed while open
};

// Makes `file` readable and writable by its owner only (0600), creating it empty when absent.
// Error naming the file when that fails.
void make_private_file(const std::filesystem::path& file);

}  // namespace trainyard::cluster
