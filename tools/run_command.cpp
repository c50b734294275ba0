#include "run_command.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tools/run_metrics.h"
#include "tools/stop_signals.h"
#include "trainyard/blas_core.h"
#include "trainyard/cluster/node_resources.h"
#include "trainyard/comm/address.h"
#include "trainyard/cpu_count.h"
#include "trainyard/elastic/c10d_backend.h"
#include "trainyard/elastic/etcd_backend.h"
#include "trainyard/elastic/launcher.h"
#include "trainyard/elastic/rendezvous.h"
#include "trainyard/error.h"
#include "trainyard/log.h"
#include "trainyard/seconds.h"

namespace trainyard::cli {
namespace {

constexpr int kMaxNprocPerNode = 4096;
constexpr int kStaticDefaultPort = 29500;  // torchrun's --master-port default, shared by all nodes

// The flags as given, before they are resolved into LaunchOptions.
struct RunFlags {
  int nproc_per_node = 1;
  std::string nnodes = "1";  // N or MIN:MAX
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string rdzv_id = "none";
  std::string rdzv_backend = "static";
  std::string rdzv_endpoint;
  std::string rdzv_conf;
  std::string local_addr;
  bool standalone = false;
  int max_restarts = 0;
  double monitor_interval = 0.5;      // seconds
  double restart_backoff = 1.0;       // seconds
  double restart_backoff_max = 30.0;  // seconds
  std::string log_dir;
  std::string role = "default";
  bool no_prefix = false;
  std::string hang_timeout;  // seconds; empty: $TRAINYARD_HANG_TIMEOUT or the default
  int metrics_port = -1;     // -1: no metrics endpoint; 0: a free port
  std::string metrics_bind = "127.0.0.1";
  std::vector<std::string> command;
};

// Seconds in [0, 1e6] (0: off), as the hang timeout; nullopt when text is not such a number.
std::optional<std::chrono::milliseconds> parse_hang_timeout(const std::string& text) {
  return parse_seconds(text, 0, 1e6);
}

std::optional<int> parse_int(std::string_view text) {
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// A validator for a whole number in [min, max] whose message names the variable the value may
// have come from and carries a hint.
CLI::Validator whole_number(int min, int max, const std::string& envname, const std::string& hint) {
  return CLI::Validator(
      [=](std::string& value) -> std::string {
        auto n = parse_int(value);
        if (n && *n >= min && *n <= max) return {};
        return detail::concat("must be a whole number between ", min, " and ", max, ", got '",
                              value, "' (from the flag or ", envname, "). HINT: ", hint);
      },
      "");
}

// --nproc-per-node as torchrun takes it (and Kubeflow Trainer v2 sets PET_NPROC_PER_NODE on GPU
// pods): a whole number, or auto (the visible GPUs when there are any, else the usable CPUs),
// cpu (the usable CPUs) or gpu (the visible GPUs; an error without any). The word is replaced by
// its number before CLI11 converts it.
CLI::Validator nproc_per_node_value() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        if (value == "auto" || value == "cpu" || value == "gpu") {
          auto gpus = cluster::detect_nvml_gpus();
          if (const char* visible = std::getenv(cluster::kCudaVisibleDevicesEnv))
            gpus = cluster::select_visible_gpus(gpus, visible);
          if (value == "gpu" && gpus.empty()) {
            return "is 'gpu', but this node has no GPU that NVML (libnvidia-ml.so.1) and "
                   "CUDA_VISIBLE_DEVICES leave visible. HINT: --nproc-per-node cpu, or a number.";
          }
          const int n =
              value == "cpu" || gpus.empty() ? usable_cpu_count() : static_cast<int>(gpus.size());
          value = std::to_string(std::min(n, kMaxNprocPerNode));
          return {};
        }
        auto n = parse_int(value);
        if (n && *n >= 1 && *n <= kMaxNprocPerNode) return {};
        return detail::concat("must be a whole number between 1 and ", kMaxNprocPerNode,
                              ", or auto, cpu or gpu; got '", value,
                              "' (from the flag or PET_NPROC_PER_NODE). HINT: the number of "
                              "ranks on this node, e.g. 4, or auto for one per GPU (else per "
                              "CPU).");
      },
      "");
}

// A validator for a number of seconds in [min, max].
CLI::Validator seconds_in(double min, double max, const std::string& envname) {
  return CLI::Validator(
      [=](std::string& value) -> std::string {
        if (parse_seconds(value, min, max)) return {};
        return detail::concat("must be a number of seconds between ", min, " and ", max, ", got '",
                              value, "' (from the flag or ", envname, ").");
      },
      "");
}

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
}

// --nnodes: "N" or "MIN:MAX".
std::optional<std::pair<int, int>> parse_nnodes(const std::string& text) {
  const auto colon = text.find(':');
  auto min = parse_int(std::string_view(text).substr(0, colon));
  auto max = colon == std::string::npos ? min : parse_int(std::string_view(text).substr(colon + 1));
  if (!min || !max || *min < 1 || *max < *min) return std::nullopt;
  return std::pair{*min, *max};
}

struct Endpoint {
  std::string host;
  std::optional<int> port;
};

// --rdzv-endpoint: "host", "host:port", "[v6addr]:port" or a bare IPv6 address.
Endpoint parse_endpoint(const std::string& text) {
  Endpoint ep;
  std::string port_text;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    TY_CHECK(close != std::string::npos, "--rdzv-endpoint '", text,
             "' opens '[' without closing it. HINT: write [::1]:29400.");
    ep.host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      TY_CHECK(text[close + 1] == ':', "--rdzv-endpoint '", text, "' has junk after ']'.");
      port_text = text.substr(close + 2);
    }
  } else if (text.find(':') != text.rfind(':')) {
    ep.host = text;  // a bare IPv6 address
  } else {
    const auto colon = text.find(':');
    ep.host = text.substr(0, colon);
    if (colon != std::string::npos) port_text = text.substr(colon + 1);
  }
  TY_CHECK(!ep.host.empty(), "--rdzv-endpoint '", text, "' has no host. HINT: write HOST:PORT.");
  if (!port_text.empty() || (text.size() > 0 && text.back() == ':')) {
    auto port = parse_int(port_text);
    TY_CHECK(port && *port >= 0 && *port <= 65535, "--rdzv-endpoint '", text, "' has a bad port '",
             port_text, "'; it must be a number between 0 and 65535.");
    ep.port = *port;
  }
  return ep;
}

// A random run id in UUID4 form, as torchrun --standalone makes one.
std::string random_run_id() {
  std::random_device device;
  std::mt19937_64 gen((static_cast<std::uint64_t>(device()) << 32) ^ device());
  const std::uint64_t hi = (gen() & ~0xF000ull) | 0x4000ull;        // version 4
  const std::uint64_t lo = (gen() & ~(3ull << 62)) | (2ull << 62);  // variant 10
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%08llx-%04llx-%04llx-%04llx-%012llx",
                static_cast<unsigned long long>(hi >> 32),
                static_cast<unsigned long long>((hi >> 16) & 0xFFFF),
                static_cast<unsigned long long>(hi & 0xFFFF),
                static_cast<unsigned long long>(lo >> 48),
                static_cast<unsigned long long>(lo & 0xFFFFFFFFFFFFull));
  return buf;
}

// The rendezvous of an elastic (c10d or etcd) run.
std::shared_ptr<elastic::Rendezvous> make_rendezvous(const RunFlags& f,
                                                     std::pair<int, int> nodes,
                                                     const Endpoint& endpoint,
                                                     const std::string& run_id) {
  elastic::RendezvousOptions r;
  r.run_id = run_id;
  r.min_nodes = nodes.first;
  r.max_nodes = nodes.second;
  r.local_world_size = f.nproc_per_node;
  elastic::apply_rendezvous_conf(f.rdzv_conf, r);
  const bool etcd = f.rdzv_backend == "etcd";
  const int port = endpoint.port.value_or(etcd ? 2379 : 29400);
  r.local_addr = !f.local_addr.empty() ? f.local_addr
                                       : route_address(endpoint.host, port,
                                                       {.what = "the rendezvous host",
                                                        .host_flag = "--rdzv-endpoint",
                                                        .local_flag = "--local-addr"});
  const std::string key = "/trainyard/rdzv/" + run_id + "/state";
  // Reaching the backend at start is bounded by the join timeout (and a minute at most); each
  // later request by a few seconds, so that the agent's monitor never stalls long: outages are
  // ridden out by the rendezvous (Note [Backend outages]).
  const auto timeout = std::min(r.join_timeout, std::chrono::milliseconds(60'000));
  std::unique_ptr<elastic::RendezvousBackend> backend;
  if (etcd) {
    backend =
        elastic::make_etcd_backend({.endpoint = endpoint.host + ":" + std::to_string(port),
                                    .key = key,
                                    .timeout = std::min(timeout, std::chrono::milliseconds(5'000)),
                                    .max_attempts = 2});
  } else {
    backend = elastic::make_c10d_backend(
        {.host = endpoint.host,
         .port = static_cast<std::uint16_t>(port),
         .key = key,
         .timeout = timeout,
         .request_timeout = std::min(timeout, std::chrono::milliseconds(10'000))});
  }
  return std::make_shared<elastic::Rendezvous>(std::move(backend), r);
}

// Resolves the flags into the launcher's options, checking what CLI11 cannot check alone.
elastic::LaunchOptions resolve(const RunFlags& f, const CLI::App& cmd) {
  auto given = [&](const std::string& name) { return cmd.get_option(name)->count() > 0; };
  TY_CHECK(!f.command.empty(),
           "trainyard run needs a program to launch after its flags. HINT: trainyard run "
           "--nproc-per-node 2 -- python3 train.py");

  elastic::LaunchOptions o;
  o.command = f.command;
  o.nproc_per_node = f.nproc_per_node;
  o.node_rank = f.node_rank;
  o.master_addr = f.master_addr;
  o.run_id = f.rdzv_id;
  o.max_restarts = f.max_restarts;
  o.monitor_interval = to_ms(f.monitor_interval);
  o.restart_backoff = to_ms(f.restart_backoff);
  o.restart_backoff_max = to_ms(std::max(f.restart_backoff_max, f.restart_backoff));
  o.log_dir = f.log_dir;
  o.role = f.role;
  o.prefix_output = !f.no_prefix;
  // The flag (or PET_HANG_TIMEOUT), else TRAINYARD_HANG_TIMEOUT, else the default.
  std::string hang_timeout = f.hang_timeout;
  const char* hang_env = std::getenv(elastic::kHangTimeoutEnv);
  if (hang_timeout.empty() && hang_env != nullptr) hang_timeout = hang_env;
  if (!hang_timeout.empty()) {
    auto parsed = parse_hang_timeout(hang_timeout);
    TY_CHECK(parsed.has_value(), "--hang-timeout (or PET_HANG_TIMEOUT, ", elastic::kHangTimeoutEnv,
             ") must be a number of seconds in [0, 1000000], got '", hang_timeout,
             "'. HINT: 0 turns the hang watchdog off.");
    o.hang_timeout = *parsed;
  }

  auto nodes = parse_nnodes(f.nnodes);
  TY_CHECK(nodes.has_value(), "--nnodes must be N or MIN:MAX with 1 <= MIN <= MAX, got '", f.nnodes,
           "'.");
  o.nnodes = nodes->first;
  std::optional<Endpoint> endpoint;
  if (!f.rdzv_endpoint.empty()) endpoint = parse_endpoint(f.rdzv_endpoint);
  TY_CHECK(f.rdzv_conf.empty() || f.rdzv_backend != "static",
           "--rdzv-conf configures the c10d and etcd rendezvous, not static. HINT: add "
           "--rdzv-backend c10d.");
  {
    elastic::RendezvousOptions check;  // reject a bad --rdzv-conf before anything starts
    elastic::apply_rendezvous_conf(f.rdzv_conf, check);
  }

  std::optional<int> port;
  if (given("--master-port")) port = f.master_port;
  if (f.standalone) {
    // torchrun --standalone: a c10d rendezvous on localhost with a fresh run id, one node.
    TY_CHECK(nodes->second == 1, "--standalone runs a single node, but --nnodes is ", f.nnodes,
             ". HINT: drop --standalone, or --nnodes.");
    if (!given("--rdzv-id")) o.run_id = random_run_id();
  } else if (f.rdzv_backend == "c10d" || f.rdzv_backend == "etcd") {
    const bool local_only = nodes->second == 1 && !endpoint && f.rdzv_backend == "c10d";
    if (!local_only) {
      TY_CHECK(
          endpoint.has_value(), "--rdzv-backend ", f.rdzv_backend, " with --nnodes ", f.nnodes,
          " needs --rdzv-endpoint HOST[:PORT], the same on every node (",
          f.rdzv_backend == "etcd" ? "the etcd server" : "the host whose agent serves the store",
          ").");
      TY_CHECK(!given("--node-rank"),
               "--node-rank is for the static rendezvous; with --rdzv-backend ", f.rdzv_backend,
               " the rendezvous assigns node ranks. HINT: drop --node-rank.");
      o.rendezvous = make_rendezvous(f, *nodes, *endpoint, o.run_id);
    }
  } else {
    TY_CHECK(nodes->first == nodes->second, "--nnodes ", f.nnodes,
             " asks for an elastic number of nodes, which needs a dynamic rendezvous. HINT: add "
             "--rdzv-backend c10d --rdzv-endpoint HOST:PORT (or etcd).");
    // static: the endpoint, when given, is the master (as torchrun's static rendezvous).
    if (endpoint) {
      o.master_addr = endpoint->host;
      if (endpoint->port && !port) port = endpoint->port;
    }
    if (o.nnodes > 1) {
      TY_CHECK((given("--master-addr") || endpoint) && given("--node-rank"), "--nnodes ", o.nnodes,
               " with the static rendezvous needs --master-addr HOST --master-port PORT "
               "--node-rank K (K = 0..",
               o.nnodes - 1,
               ") on every node. HINT: or let the nodes meet with --rdzv-backend c10d "
               "--rdzv-endpoint HOST:PORT.");
      if (!port) port = kStaticDefaultPort;
      TY_CHECK(*port != 0, "--master-port 0 (pick a free port) cannot work across ", o.nnodes,
               " nodes: each would pick its own. HINT: give every node the same --master-port.");
    }
  }
  o.master_port = static_cast<std::uint16_t>(port.value_or(0));
  TY_CHECK(o.node_rank < o.nnodes, "--node-rank ", o.node_rank, " must be less than --nnodes ",
           o.nnodes, ".");
  return o;
}

}  // namespace

void add_run_command(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<RunFlags>();
  CLI::App* cmd = app.add_subcommand(
      "run", "Launch N ranks of a program on this node with the torchrun environment contract");
  cmd->footer(
      "Everything after the first positional argument (or after --) is the program and its "
      "arguments.\nExamples:\n  trainyard run --nproc-per-node 4 -- python3 train.py --lr 0.1\n"
      "  trainyard run --nproc-per-node 2 build/examples/mnist\nEach flag can also come from "
      "the PET_* variable shown, as with torchrun.");
  cmd->positionals_at_end();

  cmd->add_option("--nproc-per-node,--nproc_per_node", flags->nproc_per_node,
                  "Number of ranks to start on this node: N, or auto (one per GPU, else per "
                  "usable CPU), cpu or gpu")
      ->envname("PET_NPROC_PER_NODE")
      ->transform(nproc_per_node_value())
      ->type_name("N|auto|cpu|gpu")
      ->capture_default_str();
  cmd->add_option("--nnodes", flags->nnodes, "Number of nodes: N, or MIN:MAX (elastic)")
      ->envname("PET_NNODES")
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            if (parse_nnodes(value)) return {};
            return "must be N or MIN:MAX with 1 <= MIN <= MAX, got '" + value +
                   "' (from the flag or PET_NNODES). HINT: --nnodes 1 for this node alone.";
          },
          ""))
      ->type_name("N|MIN:MAX")
      ->capture_default_str();
  cmd->add_option("--node-rank,--node_rank", flags->node_rank,
                  "This node's rank among the nodes (static rendezvous)")
      ->envname("PET_NODE_RANK")
      ->check(
          whole_number(0, 1 << 20, "PET_NODE_RANK", "0 for the first node, 1 for the second, ..."))
      ->capture_default_str();
  cmd->add_option("--master-addr,--master_addr", flags->master_addr,
                  "Address of the node that hosts rank 0 (MASTER_ADDR)")
      ->envname("PET_MASTER_ADDR")
      ->capture_default_str();
  cmd->add_option("--master-port,--master_port", flags->master_port,
                  "Port of rank 0's store (MASTER_PORT); 0 or unset on one node picks a free one")
      ->envname("PET_MASTER_PORT")
      ->check(whole_number(0, 65535, "PET_MASTER_PORT",
                           "a TCP port, e.g. 29500, or 0 for a free one."));
  cmd->add_option("--rdzv-id,--rdzv_id", flags->rdzv_id, "Run id (TORCHELASTIC_RUN_ID)")
      ->envname("PET_RDZV_ID")
      ->capture_default_str();
  cmd->add_option("--rdzv-backend,--rdzv_backend", flags->rdzv_backend,
                  "Rendezvous backend: static, c10d (a store served by one agent) or etcd")
      ->envname("PET_RDZV_BACKEND")
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            if (value == "static" || value == "c10d" || value == "etcd") return {};
            return "'" + value +
                   "' is not supported; trainyard knows 'static', 'c10d' and 'etcd'. HINT: c10d "
                   "needs no other service.";
          },
          ""))
      ->type_name("static|c10d|etcd")
      ->capture_default_str();
  cmd->add_option("--rdzv-endpoint,--rdzv_endpoint", flags->rdzv_endpoint,
                  "Rendezvous endpoint HOST[:PORT] (c10d: 29400, etcd: 2379 by default)")
      ->envname("PET_RDZV_ENDPOINT");
  cmd->add_option("--rdzv-conf,--rdzv_conf", flags->rdzv_conf,
                  "Rendezvous settings key=value,...: join_timeout, last_call_timeout, "
                  "keep_alive_interval, keep_alive_max_attempt, backend_timeout (seconds)")
      ->envname("PET_RDZV_CONF");
  cmd->add_option("--local-addr,--local_addr", flags->local_addr,
                  "This node's address for the other nodes (default: the one on the route to "
                  "the rendezvous endpoint)")
      ->envname("PET_LOCAL_ADDR");
  cmd->add_flag("--standalone", flags->standalone,
                "Single-node job with a local rendezvous, a free port and a fresh run id")
      ->envname("PET_STANDALONE");
  cmd->add_option("--max-restarts,--max_restarts", flags->max_restarts,
                  "Restarts allowed before failing (TORCHELASTIC_MAX_RESTARTS)")
      ->envname("PET_MAX_RESTARTS")
      ->check(whole_number(0, 1 << 20, "PET_MAX_RESTARTS",
                           "how many times to restart the ranks, e.g. 3."))
      ->capture_default_str();
  cmd->add_option("--monitor-interval,--monitor_interval", flags->monitor_interval,
                  "Seconds between the agent's checks of the rendezvous while ranks run "
                  "(torchrun's flag; rank exits are seen at once)")
      ->envname("PET_MONITOR_INTERVAL")
      ->check(seconds_in(0.01, 3600, "PET_MONITOR_INTERVAL"))
      ->capture_default_str();
  cmd->add_option("--restart-backoff,--restart_backoff", flags->restart_backoff,
                  "Seconds to wait before the first restart; doubles for each further restart "
                  "(0: restart at once)")
      ->envname("TRAINYARD_RESTART_BACKOFF")
      ->check(seconds_in(0, 86400, "TRAINYARD_RESTART_BACKOFF"))
      ->capture_default_str();
  cmd->add_option("--restart-backoff-max,--restart_backoff_max", flags->restart_backoff_max,
                  "The longest wait before a restart, in seconds")
      ->envname("TRAINYARD_RESTART_BACKOFF_MAX")
      ->check(seconds_in(0, 86400, "TRAINYARD_RESTART_BACKOFF_MAX"))
      ->capture_default_str();
  cmd->add_option("--log-dir,--log_dir", flags->log_dir,
                  "Also write each rank's output to LOG_DIR/RUN_ID/attempt_N/LOCAL_RANK/")
      ->envname("PET_LOG_DIR");
  cmd->add_option("--hang-timeout,--hang_timeout", flags->hang_timeout,
                  "Restart (or stop) the ranks when one that reports progress (trainyard's "
                  "heartbeat) makes none for this many seconds; 0: off (default: " +
                      std::to_string(elastic::kDefaultHangTimeout.count()) + ")")
      ->envname("PET_HANG_TIMEOUT")
      ->type_name("SECONDS")
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            if (parse_hang_timeout(value)) return {};
            return "must be a number of seconds in [0, 1000000], got '" + value +
                   "' (from the flag or PET_HANG_TIMEOUT). HINT: 0 turns the watchdog off.";
          },
          ""));
  cmd->add_option("--metrics-port,--metrics_port", flags->metrics_port,
                  "Serve this node's and its ranks' metrics for Prometheus at "
                  "http://METRICS_BIND:PORT/metrics while the ranks run (0: a free port, printed)")
      ->envname("PET_METRICS_PORT")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--metrics-bind,--metrics_bind", flags->metrics_bind,
                  "Address the metrics endpoint listens on (0.0.0.0: every interface)")
      ->capture_default_str();
  cmd->add_option("--role", flags->role, "Role name of the ranks (ROLE_NAME)")
      ->capture_default_str();
  cmd->add_flag("--no-prefix,--no_prefix", flags->no_prefix,
                "Forward the ranks' output without the \"[rankN]: \" prefix");
  cmd->add_option("command", flags->command, "The program to launch, then its arguments")
      ->expected(1, -1);

  cmd->callback([flags, cmd, &exit_code] {
    elastic::LaunchOptions options = resolve(*flags, *cmd);
    set_blas_core_for_children();
    std::unique_ptr<RunMetrics> metrics;
    if (flags->metrics_port >= 0) {
      metrics = std::make_unique<RunMetrics>(RunMetricsOptions{
          .bind_address = flags->metrics_bind, .port = flags->metrics_port, .job = options.run_id});
      metrics->attach(options);
    }
    try {
      exit_code = launch_until_signalled(options).exit_code();
    } catch (const Error& e) {
      // torchrun puts python before a script; trainyard runs the program as given.
      const std::string& program = options.command.front();
      if (program.size() > 3 && program.ends_with(".py") &&
          std::string_view(e.what()).starts_with("Could not start")) {
        throw Error(detail::concat(e.what(), "\nHINT: unlike torchrun, trainyard run does not ",
                                   "add python; name the interpreter: trainyard run -- python3 ",
                                   program));
      }
      throw;
    }
  });
}

}  // namespace trainyard::cli
