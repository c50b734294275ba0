// The environment contract: parsed values, defaults, and errors that name the variable; and the
// wait for MASTER_ADDR:MASTER_PORT before a rank connects to the store.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <thread>

#include "trainyard/comm/address.h"
#include "trainyard/comm/dist_env.h"
#include "trainyard/comm/process_group.h"
#include "trainyard/error.h"

namespace {
using trainyard::parse_dist_env;

trainyard::EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

const std::map<std::string, std::string> kFull = {{"RANK", "3"},
                                                  {"WORLD_SIZE", "4"},
                                                  {"LOCAL_RANK", "1"},
                                                  {"LOCAL_WORLD_SIZE", "2"},
                                                  {"GROUP_RANK", "1"},
                                                  {"MASTER_ADDR", "10.1.2.3"},
                                                  {"MASTER_PORT", "29501"},
                                                  {"TORCHELASTIC_RESTART_COUNT", "2"},
                                                  {"TORCHELASTIC_RUN_ID", "job7"}};

TEST(DistEnv, ParsesTheContract) {
  auto e = parse_dist_env(env_of(kFull));
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.group_rank, 1);
  EXPECT_EQ(e.master_addr, "10.1.2.3");
  EXPECT_EQ(e.master_port, 29501);
  EXPECT_EQ(e.restart_count, 2);
  EXPECT_EQ(e.run_id, "job7");
  EXPECT_FALSE(e.use_agent_store);
}

void expect_error_naming(std::map<std::string, std::string> vars, const std::string& needle) {
  try {
    parse_dist_env(env_of(std::move(vars)));
    FAIL() << "expected an error naming " << needle;
  } catch (const trainyard::InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("HINT"), std::string::npos) << e.what();
  }
}

TEST(DistEnv, NamesTheMissingOrBadVariable) {
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    auto vars = kFull;
    vars.erase(name);
    expect_error_naming(vars, name);
  }
  auto vars = kFull;
  vars["RANK"] = "4";
  expect_error_naming(vars, "RANK=4");
  vars = kFull;
  vars["MASTER_PORT"] = "http";
  expect_error_naming(vars, "MASTER_PORT='http'");
  vars = kFull;
  vars["WORLD_SIZE"] = "0";
  expect_error_naming(vars, "WORLD_SIZE=0");
}

TEST(DistEnv, DefaultsLocalValues) {
  auto e = parse_dist_env(
      env_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1234"}}));
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
}

}  // namespace

namespace {

TEST(InitOptions, TimeoutsFromTheEnvironment) {
  using namespace std::chrono_literals;
  auto defaults = trainyard::init_options_from_env(env_of({}));
  EXPECT_EQ(defaults.timeout, trainyard::kDefaultCollectiveTimeout);
  EXPECT_EQ(defaults.join_timeout, trainyard::kDefaultJoinTimeout);
  auto set = trainyard::init_options_from_env(
      env_of({{trainyard::kCollectiveTimeoutEnv, "42.5"}, {trainyard::kJoinTimeoutEnv, "3"}}));
  EXPECT_EQ(set.timeout, 42500ms);
  EXPECT_EQ(set.join_timeout, 3s);
  try {
    trainyard::init_options_from_env(env_of({{trainyard::kCollectiveTimeoutEnv, "soon"}}));
    FAIL() << "accepted a timeout that is not a number";
  } catch (const trainyard::InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("TRAINYARD_COLLECTIVE_TIMEOUT='soon'"), std::string::npos)
        << e.what();
  }
}

TEST(InitOptions, DeviceAndBackendFromTheEnvironment) {
  const auto defaults = trainyard::init_options_from_env(env_of({}));
  EXPECT_EQ(defaults.device, "cpu");
  EXPECT_EQ(defaults.backend, "auto");
  const auto set = trainyard::init_options_from_env(
      env_of({{trainyard::kDeviceEnv, "cuda"}, {trainyard::kBackendEnv, "gloo"}}));
  EXPECT_EQ(set.device, "cuda");
  EXPECT_EQ(set.backend, "gloo");
}

// Note [Choosing the backend], for what a CPU machine can check: Gloo on the CPU whatever
// "auto" or "gloo" say, and clear errors for a backend that does not exist or NCCL on the CPU.
TEST(InitOptions, BackendChoiceAndItsErrors) {
  const c10::Device cpu(c10::kCPU);
  EXPECT_FALSE(trainyard::use_nccl(trainyard::InitOptions{}, cpu, 1));
  EXPECT_FALSE(trainyard::use_nccl(trainyard::InitOptions{.backend = "gloo"}, cpu, 1));
  auto message = [&](const char* backend) {
    try {
      trainyard::use_nccl(trainyard::InitOptions{.backend = backend}, cpu, 1);
    } catch (const trainyard::InvalidArgumentError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("mpi").find("TRAINYARD_BACKEND) is 'mpi'"), std::string::npos)
      << message("mpi");
  EXPECT_NE(message("mpi").find("auto, gloo or nccl"), std::string::npos);
  EXPECT_NE(message("nccl").find("needs --device cuda"), std::string::npos) << message("nccl");
}

// A socket on 127.0.0.1 bound to a free port but not listening: connects to it are refused until
// it listens.
struct RefusingPort {
  RefusingPort() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), len), 0);
    EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port = ntohs(addr.sin_port);
  }
  ~RefusingPort() { ::close(fd); }
  int fd = -1;
  std::uint16_t port = 0;
};

TEST(WaitUntilReachable, AHostThatRefusesIsWaitedForUpToTheLongerLimit) {
  // Rank 0's node starting late: its host answers (refuses) until the store listens.
  using namespace std::chrono_literals;
  RefusingPort store;
  std::thread starts_late([&] {
    std::this_thread::sleep_for(500ms);
    ::listen(store.fd, 4);
  });
  EXPECT_NO_THROW(trainyard::wait_until_reachable("127.0.0.1", store.port, /*timeout=*/100ms,
                                                  /*refused_timeout=*/30s, "the store", "none"));
  starts_late.join();
}

TEST(WaitUntilReachable, ARefusingHostFailsAfterItsLimitNamingWhatAndWhy) {
  using namespace std::chrono_literals;
  RefusingPort nobody;
  try {
    trainyard::wait_until_reachable("127.0.0.1", nobody.port, 100ms, 300ms, "the test store",
                                    "start it");
    FAIL() << "expected a NetworkError";
  } catch (const trainyard::NetworkError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("Cannot reach the test store within"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Connection refused"), std::string::npos) << msg;
    EXPECT_NE(msg.find("HINT: start it"), std::string::npos) << msg;
  }
}

}  // namespace
