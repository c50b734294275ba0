#include "trainyard/cluster/state_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>

#include "trainyard/cluster/node_resources.h"
#include "trainyard/error.h"
#include "trainyard/log.h"
#include "trainyard/text_file.h"

// Note [One owner per state directory]
// Two heads on one --state-dir each believed the database was theirs: the second declared the
// first one's healthy nodes dead and failed its running job. Two workers on one folder took the
// same node id and ran every job twice. So a daemon holds an exclusive flock() on <dir>/lock for
// its life. The kernel drops the lock when the process ends however it ends (kill -9 included),
// so there is no stale lock to clean up after a crash; the file's text (who, host, pid, start
// time) is only for the message the next process gets. The descriptor is close-on-exec, so the
// ranks a worker starts never inherit the lock. A lock is per open file description: a second
// daemon in the same process (a test) is refused as another process would be.

namespace trainyard::cluster {
namespace {

std::string local_time_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}


}  // namespace

StateDir::StateDir(std::filesystem::path path, std::string_view owner) : path_(std::move(path)) {
  std::error_code ec;
  std::filesystem::create_directories(path_, ec);
  TY_CHECK_T(Error, !ec, "Could not create the state directory ", path_.string(), ": ",
             ec.message(), ". HINT: pass a writable --state-dir.");
  // Its token and job records are this user's alone (Note [A token file only its user controls]
  // in auth.cpp): root may chmod another user's folder, but that user could read it before.
  struct stat st {};
  TY_CHECK_T(Error, ::stat(path_.c_str(), &st) == 0, "Could not read the state directory ",
             path_.string(), ": ", std::strerror(errno), ".");
  TY_CHECK(st.st_uid == ::geteuid(), "The state directory ", path_.string(), " belongs to uid ",
           st.st_uid, ", not to this user (uid ", ::geteuid(), "): its owner could read the ",
           owner, "'s token and records. HINT: pass a --state-dir of your own.");
  TY_CHECK_T(Error, ::chmod(path_.c_str(), 0700) == 0, "Could not make the state directory ",
             path_.string(), " private (chmod 700): ", std::strerror(errno), ".");
  const std::filesystem::path lock = path_ / kLockFile;
  fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  TY_CHECK_T(Error, fd_ >= 0, "Could not open ", lock.string(), ": ", std::strerror(errno), ".");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK) {
      throw Error(detail::concat("Could not lock ", lock.string(), ": ", std::strerror(err), "."));
    }
    std::string holder = trim_whitespace(read_text_file(lock.string()).value_or(""));
    if (holder.empty()) holder = "another process";
    throw InvalidArgumentError(detail::concat(
        "The state directory ", path_.string(), " is in use by ", holder, ". One process owns a ",
        "state directory: a second ", owner, " there would take over the first one's nodes and ",
        "jobs. HINT: stop that process first, or give this one its own --state-dir."));
  }
  const std::string text = detail::concat(owner, " (host ", local_hostname(), ", pid ", ::getpid(),
                                          ", started ", local_time_now(), ")\n");
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, text.data(), text.size(), 0) < 0) {
    logger("cluster")->warn("Could not write the holder into {}: {}", lock.string(),
                            std::strerror(errno));
  }
}

StateDir::~StateDir() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

void make_private_file(const std::filesystem::path& file) {
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  TY_CHECK_T(Error, fd >= 0, "Could not create ", file.string(), ": ", std::strerror(errno), ".");
  const int rc = ::fchmod(fd, 0600);
  const int err = errno;
  ::close(fd);
  TY_CHECK_T(Error, rc == 0, "Could not make ", file.string(),
             " private (chmod 600): ", std::strerror(err), ".");
}

}  // namespace trainyard::cluster
