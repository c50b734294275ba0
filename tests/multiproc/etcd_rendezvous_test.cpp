// The etcd rendezvous backend against a real etcd (Debian's etcd-server, installed by
// scripts/setup.sh), started per test on 127.0.0.1 with free ports and a temporary data dir: the
// backend's compare-and-set, whole rendezvous rounds through it with nodes as threads, a dead
// participant, and endpoints where no etcd answers.
#include "trainyard/elastic/etcd_backend.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "etcd_server.h"
#include "multiproc_util.h"
#include "trainyard/elastic/rendezvous.h"
#include "trainyard/elastic/subprocess.h"
#include "trainyard/error.h"

namespace trainyard::elastic {
namespace {

using namespace std::chrono_literals;
using mptest::TempDir;
using SteadyClock = std::chrono::steady_clock;

constexpr const char* kKey = "/trainyard/rdzv/etcd-test/state";
constexpr std::uint16_t kMasterPort = 12345;

double seconds_since(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

// The message of the E that f throws; a test failure when it throws nothing.
template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

std::vector<RendezvousInfo> next_round_all(const std::vector<Rendezvous*>& nodes) {
  std::vector<RendezvousInfo> infos(nodes.size());
  std::vector<std::exception_ptr> errors(nodes.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        infos[i] = nodes[i]->next_round([] { return kMasterPort; }).value();
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return infos;
}

class EtcdRendezvousTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kEtcd)) {
      TY_MISSING_PREREQUISITE(
          "etcd is not installed at "
          << kEtcd << "; run scripts/setup.sh to install it (Debian package etcd-server).");
    }
    etcd_ = std::make_unique<EtcdServer>();
  }

  std::unique_ptr<RendezvousBackend> backend() const {
    return make_etcd_backend(
        {.endpoint = etcd_->endpoint(), .key = kKey, .timeout = 2s, .max_attempts = 2});
  }

  // Short timeouts: a last call of 0.3 s, a participant dead after 3 x 0.2 s of silence.
  std::unique_ptr<Rendezvous> node(const std::string& id, int min, int max, int nproc) const {
    return std::make_unique<Rendezvous>(backend(), RendezvousOptions{.run_id = "etcd-test",
                                                                     .min_nodes = min,
                                                                     .max_nodes = max,
                                                                     .node_id = id,
                                                                     .local_addr = "127.0.0.1",
                                                                     .local_world_size = nproc,
                                                                     .join_timeout = 10s,
                                                                     .last_call_timeout = 300ms,
                                                                     .keep_alive_interval = 200ms,
                                                                     .keep_alive_max_attempt = 3,
                                                                     .poll_interval = 20ms});
  }

  std::unique_ptr<EtcdServer> etcd_;
};

TEST_F(EtcdRendezvousTest, BackendCompareAndSet) {
  auto b = backend();
  EXPECT_EQ(b->describe(), "etcd at http://" + etcd_->endpoint());
  EXPECT_FALSE(b->get_state().has_value());

  // Create: only while nothing is stored.
  const auto created = b->set_state("one", std::nullopt);
  ASSERT_TRUE(created.written);
  EXPECT_EQ(created.state, "one");
  EXPECT_EQ(b->get_state(), std::make_pair(std::string("one"), created.token));
  const auto again = b->set_state("other", std::nullopt);
  EXPECT_FALSE(again.written);
  EXPECT_EQ(again.state, "one");
  EXPECT_EQ(again.token, created.token);

  // Compare-and-set with the current token writes and gives a new token.
  const auto second = b->set_state("two", created.token);
  ASSERT_TRUE(second.written);
  EXPECT_NE(second.token, created.token);
  EXPECT_EQ(b->get_state(), std::make_pair(std::string("two"), second.token));

  // A stale token writes nothing and returns what is stored.
  const auto stale = b->set_state("three", created.token);
  EXPECT_FALSE(stale.written);
  EXPECT_EQ(stale.state, "two");
  EXPECT_EQ(stale.token, second.token);

  // Values of every length modulo 3 (base64 padding), binary bytes, UTF-8, and empty (which
  // etcd's answers leave out).
  std::string token = second.token;
  for (const std::string& value :
       {std::string("a"), std::string("ab"), std::string("abc"), std::string("x\0\xff\n", 4),
        std::string("{\"é\": 1}"), std::string()}) {
    const auto r = b->set_state(value, token);
    ASSERT_TRUE(r.written) << "value of " << value.size() << " bytes";
    token = r.token;
    EXPECT_EQ(b->get_state(), std::make_pair(value, token));
  }

  // A second backend on the same key sees the same state and token.
  EXPECT_EQ(backend()->get_state(), b->get_state());
}

TEST_F(EtcdRendezvousTest, ConcurrentCompareAndSetLosesNoUpdate) {
  constexpr int kThreads = 3, kIncrements = 20;
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        auto b = backend();  // one connection per thread, as one per agent
        for (int i = 0; i < kIncrements; ++i) {
          auto now = b->get_state();
          while (true) {
            const int next = now ? std::stoi(now->first) + 1 : 1;
            auto r =
                b->set_state(std::to_string(next), now ? std::optional(now->second) : std::nullopt);
            if (r.written) break;
            now = std::make_pair(r.state, r.token);
          }
        }
      } catch (...) {
        errors[t] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  EXPECT_EQ(backend()->get_state().value().first, std::to_string(kThreads * kIncrements));
}

TEST_F(EtcdRendezvousTest, CompareAndSetAfterTheKeyWasDeletedIsAnError) {
  constexpr const char* kEtcdctl = "/usr/bin/etcdctl";
  if (!std::filesystem::exists(kEtcdctl)) {
    TY_MISSING_PREREQUISITE(kEtcdctl << " is not installed; run scripts/setup.sh (etcd-client).");
  }
  auto b = backend();
  const auto created = b->set_state("one", std::nullopt);
  ASSERT_TRUE(created.written);
  const auto del = mptest::run_program(
      {kEtcdctl, "--endpoints=http://" + etcd_->endpoint(), "del", kKey}, {{"ETCDCTL_API", "3"}});
  ASSERT_TRUE(del.status.success()) << del.out << del.err;

  const auto msg = error_of<Error>([&] { b->set_state("two", created.token); });
  EXPECT_NE(msg.find("was deleted while this node was changing it"), std::string::npos) << msg;
  EXPECT_FALSE(b->get_state().has_value());
  EXPECT_TRUE(b->set_state("again", std::nullopt).written);
}

TEST_F(EtcdRendezvousTest, HttpErrorsGiveTheStatusAndTheBody) {
  // A token that is no revision: etcd's gateway cannot parse the request.
  auto msg = error_of<Error>([&] { backend()->set_state("x", "not-a-revision"); });
  EXPECT_NE(msg.find("etcd at http://" + etcd_->endpoint() + " refused POST /v3/kv/txn: HTTP 400"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("invalid character"), std::string::npos) << msg;

  // etcd's peer port speaks HTTP but serves no gateway.
  auto peer = make_etcd_backend({.endpoint = etcd_->peer_endpoint(), .key = kKey, .timeout = 2s});
  msg = error_of<Error>([&] { peer->get_state(); });
  EXPECT_NE(msg.find("HTTP 404: 404 page not found"), std::string::npos) << msg;
  EXPECT_NE(msg.find("HINT: is it etcd's client URL"), std::string::npos) << msg;
}

TEST_F(EtcdRendezvousTest, TwoNodesCompleteARoundThenSeeTheNext) {
  auto a = node("node-a", 2, 2, 2);
  auto b = node("node-b", 2, 2, 3);
  const auto infos = next_round_all({a.get(), b.get()});

  EXPECT_EQ(infos[0].round, infos[1].round);
  EXPECT_EQ(std::set<int>({infos[0].group_rank, infos[1].group_rank}), std::set<int>({0, 1}));
  const int nproc[] = {2, 3};
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(infos[i].group_world_size, 2);
    EXPECT_EQ(infos[i].world_size, 5);
    // Group rank 1 starts after the other node's workers.
    EXPECT_EQ(infos[i].rank_offset, infos[i].group_rank == 0 ? 0 : nproc[1 - i]);
    EXPECT_EQ(infos[i].master_addr, "127.0.0.1");
    EXPECT_EQ(infos[i].master_port, kMasterPort);
  }
  EXPECT_EQ(b->watch(), RoundChange::kNone);

  a->start_next_round("test");
  EXPECT_EQ(b->watch(), RoundChange::kNewRound);
}

TEST_F(EtcdRendezvousTest, OneNodeCompletesAloneAfterTheLastCall) {
  auto a = node("node-a", 1, 3, 4);
  const auto start = SteadyClock::now();
  const auto infos = next_round_all({a.get()});
  const double took = seconds_since(start);

  EXPECT_GE(took, 0.3);  // the last-call window waits for more nodes
  EXPECT_LT(took, 6.0) << "the window is short; the rest is margin for a loaded machine";
  EXPECT_EQ(infos[0].group_rank, 0);
  EXPECT_EQ(infos[0].group_world_size, 1);
  EXPECT_EQ(infos[0].world_size, 4);
  EXPECT_EQ(infos[0].master_port, kMasterPort);
}

TEST_F(EtcdRendezvousTest, WatchReportsAParticipantWhoseHeartbeatStopped) {
  auto a = node("node-a", 2, 2, 1);
  auto b = node("node-b", 2, 2, 1);
  next_round_all({a.get(), b.get()});
  EXPECT_EQ(a->watch(), RoundChange::kNone);

  // b's last heartbeat: its watch refreshes it once keep_alive_interval has passed.
  std::this_thread::sleep_for(250ms);
  EXPECT_EQ(b->watch(), RoundChange::kNone);
  const auto silent_since = SteadyClock::now();

  RoundChange change = RoundChange::kNone;
  while (change == RoundChange::kNone && seconds_since(silent_since) < 10.0) {
    std::this_thread::sleep_for(20ms);
    change = a->watch();  // also keeps a's own heartbeat fresh
  }
  const double took = seconds_since(silent_since);
  EXPECT_EQ(change, RoundChange::kParticipantLost);
  EXPECT_GE(took, 0.5);  // keep_alive_interval * keep_alive_max_attempt = 0.6 s, less clock slack
  EXPECT_LT(took, 5.0) << "0.6 s plus a generous margin for a loaded machine";
}

TEST_F(EtcdRendezvousTest, ARunIdCanBeReusedOnceTheRunFinished) {
  auto a = node("node-a", 2, 2, 1);
  auto b = node("node-b", 2, 2, 1);
  const auto first = next_round_all({a.get(), b.get()});
  EXPECT_FALSE(first[0].job_instance.empty());
  EXPECT_EQ(first[0].job_instance, first[1].job_instance);
  a->mark_done();
  b->mark_done();
  EXPECT_TRUE(a->wait_closed(2s));

  // A new job with the same id, at once: a fresh generation, not RendezvousClosedError.
  auto c = node("node-c", 2, 2, 1);
  auto d = node("node-d", 2, 2, 1);
  const auto second = next_round_all({c.get(), d.get()});
  EXPECT_FALSE(second[0].job_instance.empty());
  EXPECT_NE(second[0].job_instance, first[0].job_instance);
  EXPECT_EQ(second[0].job_instance, second[1].job_instance);
  EXPECT_EQ(second[0].world_size, 2);
  // An agent of the old job finds its job over.
  const std::string msg =
      error_of<RendezvousClosedError>([&] { a->next_round([] { return kMasterPort; }); });
  EXPECT_NE(msg.find("new job with the same run id"), std::string::npos) << msg;
}

TEST_F(EtcdRendezvousTest, LastCallIsShortWhenTheMissingNodeIsKnownDead) {
  auto make = [&](const std::string& id) {
    return std::make_unique<Rendezvous>(backend(), RendezvousOptions{.run_id = "etcd-test",
                                                                     .min_nodes = 1,
                                                                     .max_nodes = 2,
                                                                     .node_id = id,
                                                                     .local_addr = "127.0.0.1",
                                                                     .join_timeout = 30s,
                                                                     .last_call_timeout = 20s,
                                                                     .keep_alive_interval = 200ms,
                                                                     .keep_alive_max_attempt = 3,
                                                                     .poll_interval = 20ms});
  };
  auto a = make("node-a");
  auto b = make("node-b");
  next_round_all({a.get(), b.get()});  // max_nodes: complete at once
  // b dies (stops beating); a ends the round and joins the next one alone.
  const auto start = SteadyClock::now();
  a->start_next_round("test");
  const auto info = a->next_round([] { return kMasterPort; });
  const double took = seconds_since(start);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->group_world_size, 1);
  EXPECT_LT(took, 5.0) << "waited for the 20 s last call although node-b was known dead";
}

TEST_F(EtcdRendezvousTest, WatchRidesOutAnOutageAndGivesUpPastBackendTimeout) {
  auto make = [&](std::chrono::milliseconds backend_timeout) {
    return std::make_unique<Rendezvous>(backend(),
                                        RendezvousOptions{.run_id = "etcd-test",
                                                          .node_id = "solo",
                                                          .local_addr = "127.0.0.1",
                                                          .join_timeout = 10s,
                                                          .last_call_timeout = 300ms,
                                                          .keep_alive_interval = 200ms,
                                                          .poll_interval = 20ms,
                                                          .backend_timeout = backend_timeout});
  };
  auto a = make(1500ms);
  ASSERT_TRUE(a->next_round([] { return kMasterPort; }).has_value());
  etcd_->stop();
  const auto start = SteadyClock::now();
  std::string msg;
  while (seconds_since(start) < 10.0) {
    try {
      EXPECT_EQ(a->watch(), RoundChange::kBackendUnreachable);
    } catch (const NetworkError& e) {
      msg = e.what();
      break;
    }
    std::this_thread::sleep_for(50ms);
  }
  const double took = seconds_since(start);
  EXPECT_GE(took, 1.4);
  EXPECT_LT(took, 5.0);
  EXPECT_NE(msg.find("has been unreachable for 1."), std::string::npos) << msg;
  EXPECT_NE(msg.find("backend_timeout is 1.5 s"), std::string::npos) << msg;
  // Back within the limit: the round still stands.
  etcd_->start();
  auto b = make(30s);
  ASSERT_TRUE(b->next_round([] { return kMasterPort; }).has_value());
  etcd_->stop();
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(b->watch(), RoundChange::kBackendUnreachable);
    std::this_thread::sleep_for(50ms);
  }
  etcd_->start();
  RoundChange change = RoundChange::kBackendUnreachable;
  const auto back = SteadyClock::now();
  while (change == RoundChange::kBackendUnreachable && seconds_since(back) < 10.0) {
    std::this_thread::sleep_for(50ms);
    change = b->watch();
  }
  EXPECT_EQ(change, RoundChange::kNone);
}

TEST(EtcdBackendTest, UnreachableEtcdThrowsNetworkErrorWithinTheTimeout) {
  // Nothing listens: each attempt is refused at once.
  int port = 0;
  mptest::bind_loopback(false, &port);  // released at once
  const std::string endpoint = "http://127.0.0.1:" + std::to_string(port);
  auto refused = make_etcd_backend({.endpoint = "127.0.0.1:" + std::to_string(port),
                                    .key = kKey,
                                    .timeout = 1s,
                                    .max_attempts = 2});
  auto start = SteadyClock::now();
  std::string msg = error_of<NetworkError>([&] { refused->get_state(); });
  EXPECT_LT(seconds_since(start), 3.0);
  EXPECT_NE(msg.find("etcd at " + endpoint), std::string::npos) << msg;
  EXPECT_NE(msg.find("2 attempt(s) over "), std::string::npos) << msg;
  EXPECT_NE(msg.find("curl error 7"), std::string::npos) << msg;
  EXPECT_NE(msg.find("HINT: is etcd running at " + endpoint), std::string::npos) << msg;

  // A listener that never answers: each attempt runs into the timeout, and no further.
  int silent_port = 0;
  const UniqueFd silent = mptest::bind_loopback(true, &silent_port);
  auto timing_out = make_etcd_backend({.endpoint = "127.0.0.1:" + std::to_string(silent_port),
                                       .key = kKey,
                                       .timeout = 500ms,
                                       .max_attempts = 2});
  start = SteadyClock::now();
  msg = error_of<NetworkError>([&] { timing_out->set_state("x", std::nullopt); });
  const double took = seconds_since(start);
  EXPECT_GE(took, 1.0);
  EXPECT_LT(took, 2.5);
  EXPECT_NE(msg.find("curl error 28"), std::string::npos) << msg;
}

TEST(EtcdBackendTest, EndpointFormsAndOptionChecks) {
  auto describe = [](const std::string& endpoint) {
    return make_etcd_backend({.endpoint = endpoint, .key = kKey})->describe();
  };
  EXPECT_EQ(describe("10.0.0.1:2380"), "etcd at http://10.0.0.1:2380");
  EXPECT_EQ(describe("http://10.0.0.1:2380/"), "etcd at http://10.0.0.1:2380");
  EXPECT_EQ(describe("etcd-host"), "etcd at http://etcd-host:2379");
  EXPECT_EQ(describe("https://etcd-host"), "etcd at https://etcd-host:2379");
  EXPECT_EQ(describe("[::1]"), "etcd at http://[::1]:2379");
  EXPECT_EQ(describe("[::1]:4001"), "etcd at http://[::1]:4001");

  auto msg = error_of<InvalidArgumentError>([] { make_etcd_backend({.key = kKey}); });
  EXPECT_NE(msg.find("EtcdOptions.endpoint"), std::string::npos) << msg;
  msg = error_of<InvalidArgumentError>(
      [] { make_etcd_backend({.endpoint = "h", .key = kKey, .max_attempts = 0}); });
  EXPECT_NE(msg.find("EtcdOptions.max_attempts must be >= 1, got 0"), std::string::npos) << msg;
  msg = error_of<InvalidArgumentError>(
      [] { make_etcd_backend({.endpoint = "h", .key = kKey, .timeout = 0ms}); });
  EXPECT_NE(msg.find("EtcdOptions.timeout"), std::string::npos) << msg;
  msg = error_of<InvalidArgumentError>([] { make_etcd_backend({.endpoint = "h"}); });
  EXPECT_NE(msg.find("EtcdOptions.key"), std::string::npos) << msg;
}

}  // namespace
}  // namespace trainyard::elastic
