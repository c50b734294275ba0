#include "trainyard/heartbeat.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "trainyard/error.h"
#include "trainyard/log.h"

namespace trainyard {
namespace {

// The file holds one slot: the steady_clock time of the last beat in nanoseconds, 0 for never.
using Slot = std::atomic<std::int64_t>;
static_assert(Slot::is_always_lock_free, "the slot is shared between processes");
constexpr std::size_t kFileBytes = 64;

// Maps the file named by $TRAINYARD_HEARTBEAT_FILE, or answers nullptr.
Slot* map_slot_from_env() noexcept {
  const char* path = std::getenv(kHeartbeatFileEnv);
  if (path == nullptr || *path == '\0') return nullptr;
  const int fd = ::open(path, O_RDWR | O_CLOEXEC);
  void* map = MAP_FAILED;
  if (fd >= 0) {
    map = ::mmap(nullptr, kFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
  }
  if (fd < 0 || map == MAP_FAILED) {
    try {
      logger("heartbeat")
          ->warn(
              "Cannot map the heartbeat file {}={}: {}; the launcher's hang watchdog will not "
              "watch this process.",
              kHeartbeatFileEnv, path, std::strerror(errno));
    } catch (...) {
    }
    return nullptr;
  }
  return static_cast<Slot*>(map);
}

std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void beat() noexcept {
  static Slot* const slot = map_slot_from_env();  // mapped once, for the process's life
  if (slot != nullptr) slot->store(now_ns(), std::memory_order_relaxed);
}

thread_local bool t_beats = false;  // this thread has called heartbeat()
std::atomic<int> g_relays{0};       // live HeartbeatRelay scopes, in any thread

}  // namespace

void heartbeat() noexcept {
  t_beats = true;
  beat();
}

void heartbeat_while_waiting() noexcept {
  // See Note [Hang watchdog] in src/elastic/rank_monitor.cpp.
  if (t_beats || g_relays.load(std::memory_order_relaxed) > 0) beat();
}

HeartbeatRelay::HeartbeatRelay() noexcept {
  g_relays.fetch_add(1, std::memory_order_relaxed);
}
HeartbeatRelay::~HeartbeatRelay() {
  g_relays.fetch_sub(1, std::memory_order_relaxed);
}

HeartbeatFile::HeartbeatFile(std::string path) : path_(std::move(path)) {
  const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || ::ftruncate(fd, kFileBytes) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    throw Error(detail::concat("Could not create the heartbeat file '", path_,
                               "': ", std::strerror(err), ". HINT: check TMPDIR."));
  }
  void* map = ::mmap(nullptr, kFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (map == MAP_FAILED) {
    throw Error(detail::concat("Could not map the heartbeat file '", path_,
                               "': ", std::strerror(err), "."));
  }
  map_ = map;
}

HeartbeatFile::~HeartbeatFile() {
  if (map_ != nullptr) ::munmap(map_, kFileBytes);
}

HeartbeatFile::HeartbeatFile(HeartbeatFile&& other) noexcept
    : path_(std::move(other.path_)), map_(std::exchange(other.map_, nullptr)) {}

HeartbeatFile& HeartbeatFile::operator=(HeartbeatFile&& other) noexcept {
  if (this != &other) {
    if (map_ != nullptr) ::munmap(map_, kFileBytes);
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
  }
  return *this;
}

std::optional<std::chrono::steady_clock::time_point> HeartbeatFile::last_beat() const {
  if (map_ == nullptr) return std::nullopt;
  const std::int64_t ns = static_cast<const Slot*>(map_)->load(std::memory_order_relaxed);
  if (ns == 0) return std::nullopt;
  return std::chrono::steady_clock::time_point(
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::nanoseconds(ns)));
}

}  // namespace trainyard
