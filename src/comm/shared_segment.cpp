#include "comm/shared_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "trainyard/error.h"

namespace trainyard {
namespace {

std::string pid_namespace() {
  char buf[64] = {};
  ssize_t n = ::readlink("/proc/self/ns/pid", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

std::string store_get_string(c10d::Store& store, const std::string& key) {
  auto v = store.get(key);
  return std::string(v.begin(), v.end());
}

void store_set_string(c10d::Store& store, const std::string& key, const std::string& value) {
  store.set(key, std::vector<std::uint8_t>(value.begin(), value.end()));
}

// A shared-memory mapping, unmapped when its last user lets go.

}  // namespace

SharedSegment::~SharedSegment() {
  if (base != nullptr) ::munmap(base, bytes);
}

MappedSegment map_group_segment(c10d::Store& store,
                                const std::string& prefix,
                                int rank,
                                int size,
                                std::size_t bytes,
                                const std::function<std::string(void* base)>& prepare) {
  MappedSegment out{.segment = std::make_shared<SharedSegment>()};
  std::string name;
  std::string failure;
  bool misuse = false;  // the ranks disagree on the size: a bug, not a missing resource
  int fd = -1;
  bool created = false;
  auto fail = [&](const std::string& what) {
    if (failure.empty()) failure = what;
  };
  auto map_and_prepare = [&] {
    void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED)
      return fail(detail::concat("cannot map ", name, ": ", std::strerror(errno)));
    out.segment->base = base;
    out.segment->bytes = bytes;
    fail(prepare(base));
  };
  try {
    if (rank == 0) {
      std::random_device rd;
      name = detail::concat("/trainyard-", ::getpid(), "-", std::hex, rd(), rd());
      fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
      created = fd >= 0;
      if (fd < 0) fail(detail::concat("cannot create ", name, ": ", std::strerror(errno)));
      // Reserve the pages now: a sparse segment on a full /dev/shm would SIGBUS mid-collective.
      const int rc = fd >= 0 ? ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)) : 0;
      if (rc != 0)
        fail(detail::concat("cannot reserve ", bytes >> 20, " MiB in /dev/shm: ", std::strerror(rc),
                            " (a small /dev/shm, as in a container?)"));
      if (failure.empty()) map_and_prepare();
      // The store's round trip orders `prepare`'s writes before the other ranks' reads.
      store_set_string(store, prefix + "segment", failure.empty() ? name : "");
    } else {
      name = store_get_string(store, prefix + "segment");
      if (name.empty()) fail("rank 0 could not create the segment");
      if (failure.empty()) fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
      if (failure.empty() && fd < 0)
        fail(detail::concat("cannot open ", name, ": ", std::strerror(errno),
                            " (is this rank on another host?)"));
      struct stat st {};
      if (failure.empty() &&
          (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != bytes)) {
        fail(detail::concat("segment ", name, " holds ", st.st_size, " bytes, expected ", bytes,
                            " (ranks disagree on world size or sizes)"));
        misuse = true;
      }
      if (failure.empty()) map_and_prepare();
    }
    if (fd >= 0) ::close(fd);
    fd = -1;
    // "1" and the pid namespace, or "0" (unavailable) or "2" (misuse) and what went wrong.
    std::string mine(1, '1');
    mine += pid_namespace();
    std::string report(1, misuse ? '2' : '0');
    report += failure;
    store_set_string(store, prefix + "ok/" + std::to_string(rank), failure.empty() ? mine : report);
    std::string first_failure;
    bool any_misuse = false;
    for (int r = 0; r < size; ++r) {
      auto v = store_get_string(store, prefix + "ok/" + std::to_string(r));
      if (v.empty() || v[0] != '1') {
        if (first_failure.empty()) first_failure = detail::concat("rank ", r, ": ", v.substr(1));
        any_misuse = any_misuse || (!v.empty() && v[0] == '2');
      } else if (v != mine) {
        out.same_pid_namespace = false;
      }
    }
    if (created) ::shm_unlink(name.c_str());  // every rank has it mapped, or failed
    created = false;
    if (any_misuse) throw InvalidArgumentError("Shared-memory segment mismatch: " + first_failure);
    if (!first_failure.empty())
      throw Error("Shared-memory process group unavailable: " + first_failure);
  } catch (...) {
    // Nothing outlives a failure: no descriptor, no name in /dev/shm (the mapping goes with out).
    if (fd >= 0) ::close(fd);
    if (created) ::shm_unlink(name.c_str());
    throw;
  }
  return out;
}

}  // namespace trainyard
