// A rank killed with SIGKILL in the middle of DDP training over the shared-memory group: the
// survivor must fail fast with a message naming the dead rank, not wait out the 5-minute timeout.
// The ranks are started by hand (no launcher, which would stop the survivor itself).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include "../multiproc/multiproc_util.h"

namespace {
using namespace std::chrono_literals;
using trainyard::elastic::Subprocess;
using trainyard::elastic::SubprocessOptions;

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Reads fd until `needle` appears or the deadline passes; answers whether it appeared.
bool wait_for_text(int fd, const std::string& needle, std::chrono::milliseconds timeout) {
  std::string seen;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) return false;
    seen.append(buf, static_cast<std::size_t>(n));
    if (seen.find(needle) != std::string::npos) return true;
  }
  return false;
}

TEST(DeadPeer, SurvivorOfASharedMemoryGroupFailsFastNamingTheDeadRank) {
  const std::string port = std::to_string(free_port());
  auto start_rank = [&](int rank) {
    return Subprocess(SubprocessOptions{
        .argv = {TRAINYARD_EXAMPLE_PATH, "1000", "12000"},  // far more epochs than it will live
        .env = {{"RANK", std::to_string(rank)},
                {"LOCAL_RANK", std::to_string(rank)},
                {"WORLD_SIZE", "2"},
                {"LOCAL_WORLD_SIZE", "2"},
                {"MASTER_ADDR", "127.0.0.1"},
                {"MASTER_PORT", port},
                {"OMP_NUM_THREADS", "1"}}});
  };
  Subprocess rank0 = start_rank(0);
  Subprocess rank1 = start_rank(1);
  // DDP is built (over the shared-memory group) once this line is logged; training follows.
  ASSERT_TRUE(wait_for_text(rank1.stderr_fd(), "DistributedDataParallel:", 40s))
      << "rank 1 never reached DDP construction";
  std::this_thread::sleep_for(1s);
  ASSERT_TRUE(rank1.send_signal(SIGKILL));
  const auto killed = std::chrono::steady_clock::now();

  auto out = trainyard::mptest::collect(rank0, 30s);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  ASSERT_FALSE(out.timed_out) << "rank 0 hung after its peer died";
  EXPECT_FALSE(out.status.success()) << out.err;
  EXPECT_LT(seconds, 10.0) << "the pid check notices a dead peer in well under the timeout";
  EXPECT_NE(out.err.find("rank 1 (pid "), std::string::npos) << out.err;
  EXPECT_NE(out.err.find("exited during a shared-memory collective"), std::string::npos) << out.err;
}

}  // namespace
