#include "tools/daemon_commands.h"

#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "tools/stop_signals.h"
#include "trainyard/cluster/auth.h"
#include "trainyard/cluster/head.h"
#include "trainyard/cluster/head_client.h"
#include "trainyard/cluster/worker.h"
#include "trainyard/comm/address.h"
#include "trainyard/env.h"
#include "trainyard/error.h"
#include "trainyard/log.h"
#include "trainyard/net/base_url.h"
#include "trainyard/seconds.h"

namespace trainyard::cli {
namespace {

// Blocks until SIGINT, SIGTERM, SIGHUP or SIGQUIT, caught by `signals`' thread; returns it.
class SignalWait {
 public:
  SignalWait()
      : signals_([this](int sig) {
          if (!seen_.exchange(true)) got_.set_value(sig);
        }) {}
  int wait() { return got_.get_future().get(); }

 private:
  std::atomic<bool> seen_{false};
  std::promise<int> got_;
  StopSignals signals_;  // last: its thread calls into seen_ and got_
};

using std::chrono::milliseconds;

// What this node declares, as Ray's --num-cpus/--num-gpus/--memory do.
struct ResourceFlags {
  std::optional<double> num_cpus;
  std::optional<double> num_gpus;
  std::optional<std::int64_t> memory;
};

void add_resource_flags(CLI::App& c, ResourceFlags& f) {
  c.add_option("--num-cpus", f.num_cpus,
               "CPUs this node offers to ranks (default: what the machine, its affinity and its "
               "cgroup allow)")
      ->check(CLI::Range(0.0, 1e6));
  c.add_option("--num-gpus", f.num_gpus, "GPUs this node offers (default: what NVML finds)")
      ->check(CLI::Range(0.0, 1024.0));
  c.add_option("--memory", f.memory, "Bytes of memory this node offers (default: the machine's)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 60));
}

cluster::DetectOptions overrides(const ResourceFlags& f) {
  cluster::DetectOptions o;
  o.num_cpus = f.num_cpus;
  o.num_gpus = f.num_gpus;
  o.memory_bytes = f.memory;
  return o;
}

// The head serves up to HttpServerOptions::max_connections clients at once besides its own files;
// Debian's default soft limit of 1,024 descriptors would refuse accept()s first. The soft limit
// is process-global, so main's command raises it (to the hard limit, at most 65,536).
void raise_open_file_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  const rlim_t want = std::min<rlim_t>(limit.rlim_max, 65'536);
  if (limit.rlim_cur >= want) return;
  limit.rlim_cur = want;
  if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    logger("head")->warn("Could not raise the open file limit to {}: {}", want,
                         std::strerror(errno));
  }
}

void add_head(CLI::App& app, int& exit_code) {
  struct Flags {
    std::string bind = "127.0.0.1";
    int port = cluster::kDefaultHeadPort;
    std::string token_file;
    bool insecure_no_token = false;
    std::string state_dir;
    std::string heartbeat_interval = "2";
    std::string dead_after = "10";
    ResourceFlags resources;
  };
  auto f = std::make_shared<Flags>();
  auto* c = app.add_subcommand("head",
                               "Serve the cluster: the Jobs API, the job store, the "
                               "scheduler; also runs ranks unless --num-cpus 0");
  c->add_option("--bind", f->bind,
                "The address to listen on; anything but loopback needs --token-file")
      ->capture_default_str();
  c->add_option("--port", f->port, "The port of the API (Ray's dashboard port by default)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  c->add_option("--token-file", f->token_file,
                "The cluster token, in a file only its owner can read (default: $TRAINYARD_TOKEN, "
                "else one the head makes in --state-dir)");
  c->add_flag("--insecure-no-token", f->insecure_no_token,
              "Serve without a token: any local user or container can then run commands as you "
              "(loopback only)");
  c->add_option("--state-dir", f->state_dir,
                "The head's database, its generated token and this node's identity (default: "
                "~/.trainyard/head)");
  c->add_option("--heartbeat-interval", f->heartbeat_interval,
                "Seconds between a worker's heartbeats")
      ->capture_default_str();
  c->add_option("--dead-after", f->dead_after,
                "Seconds without a heartbeat before a node is declared dead")
      ->capture_default_str();
  add_resource_flags(*c, f->resources);
  c->callback([f, &exit_code] {
    const auto interval = parse_seconds(f->heartbeat_interval, 0.05, 3600);
    TY_CHECK_T(InvalidArgumentError, interval.has_value(), "--heartbeat-interval '",
               f->heartbeat_interval, "' is not a number of seconds in [0.05, 3600].");
    const auto dead_after = parse_seconds(f->dead_after, 0.1, 86400);
    // A node is suspect after three missed heartbeats and dead later than that.
    TY_CHECK_T(InvalidArgumentError, dead_after.has_value() && *dead_after > 3 * *interval,
               "--dead-after '", f->dead_after,
               "' must be a number of seconds longer than three --heartbeat-interval (",
               3 * interval->count() / 1000.0,
               " s): a node is suspect after three missed "
               "heartbeats, dead after --dead-after.");
    std::optional<std::string> token;
    if (!f->insecure_no_token) {
      // The head's own token only: a local head's generated one is not this head's.
      if (!f->token_file.empty()) {
        token = cluster::load_token(f->token_file);
      } else if (const char* env = std::getenv(kTokenEnv); env && *env) {
        token = env;
      }
    }
    if (f->state_dir.empty()) f->state_dir = cluster::default_head_state_dir().string();
    raise_open_file_limit();
    SignalWait signals;
    cluster::Head head({.bind_address = f->bind,
                        .port = f->port,
                        .token = token,
                        .unauthenticated = f->insecure_no_token,
                        .state_dir = f->state_dir,
                        .heartbeat_interval = *interval,
                        .dead_after = *dead_after});
    head.start();
    std::printf("trainyard head: serving %s (state in %s)\n",
                net::http_url(f->bind, head.port()).c_str(), f->state_dir.c_str());
    if (!head.generated_token_file().empty()) {
      std::printf(
          "The cluster token is in %s (only you can read it). Clients and workers on this host "
          "find it there when the head uses its default --state-dir; elsewhere give them a copy "
          "with --token-file, or its text in %s.\n",
          head.generated_token_file().c_str(), kTokenEnv);
    }
    std::fflush(stdout);
    // The head's own node runs ranks as a worker of itself, as the seeds' Ray head task trains.
    std::unique_ptr<cluster::Worker> worker;
    if (!f->resources.num_cpus || *f->resources.num_cpus > 0) {
      const bool any = f->bind == "0.0.0.0" || f->bind == "::";
      cluster::WorkerOptions w{
          .head = net::http_url(any ? std::string("127.0.0.1") : f->bind, head.port()),
          .token = head.token(),
          .state_dir = f->state_dir + "/node",
          .resources = overrides(f->resources),
          .heartbeat_interval = *interval};
      // Other nodes must reach this one's ranks at a real address.
      if (any) w.address = first_interface_address();
      worker = std::make_unique<cluster::Worker>(std::move(w));
      worker->start();
    }
    const int sig = signals.wait();
    logger("head")->info("Received signal {}; stopping.", sig);
    if (worker) worker->stop("exited");
    head.stop();
    exit_code = 0;
  });
}

void add_worker(CLI::App& app, int& exit_code) {
  struct Flags {
    std::string head;
    std::string token_file;
    std::string state_dir;
    std::string address;
    bool forward_output = false;
    ResourceFlags resources;
  };
  auto f = std::make_shared<Flags>();
  auto* c = app.add_subcommand("worker", "Join a head and run the ranks it places on this node");
  c->add_option("--head", f->head,
                "The head: HOST:PORT (a DNS name is resolved again on every attempt)")
      ->required();
  c->add_option("--token-file", f->token_file,
                "The cluster token, in a file only its owner can read (default: $TRAINYARD_TOKEN)");
  c->add_option("--state-dir", f->state_dir,
                "This node's identity and its jobs' log spools (one per worker on a machine)")
      ->required();
  c->add_option("--address", f->address,
                "How the other nodes reach this one (default: its address on the route to the "
                "head)");
  c->add_flag("--forward-output", f->forward_output,
              "Also print the ranks' output here (it always goes to the head)");
  add_resource_flags(*c, f->resources);
  c->callback([f, &exit_code] {
    SignalWait signals;
    cluster::Worker worker({.head = f->head,
                            .token = cluster::resolve_token(f->token_file),
                            .state_dir = f->state_dir,
                            .resources = overrides(f->resources),
                            .address = f->address,
                            .forward_output = f->forward_output});
    worker.start();
    std::printf("trainyard worker: node %s joining the head at %s\n", worker.node_id().c_str(),
                f->head.c_str());
    std::fflush(stdout);
    const int sig = signals.wait();
    logger("worker")->info("Received signal {}; leaving the cluster.", sig);
    worker.stop("exited");
    exit_code = 0;
  });
}

}  // namespace

void add_daemon_commands(CLI::App& app, int& exit_code) {
  add_head(app, exit_code);
  add_worker(app, exit_code);
}

}  // namespace trainyard::cli
