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

#include "tools/launch_flags.h"
#include "tools/run_metrics.h"
#include "tools/stop_signals.h"
#include "trainyard/blas_core.h"
#include "trainyard/cluster/node_resources.h"
#include "trainyard/comm/address.h"
#include "trainyard/cpu_count.h"
#include "trainyard/elastic/c10d_backend.h"
#include "trainyard/elastic/etcd_backend.h"
#include "trainyard/elastic/launch_contract.h"
#include "trainyard/elastic/launcher.h"
#include "trainyard/elastic/rendezvous.h"
#include "trainyard/env.h"
#include "trainyard/error.h"
#include "trainyard/log.h"
#include "trainyard/seconds.h"

namespace trainyard::cli {
namespace {

constexpr int kStaticDefaultPort = 29500;  // torchrun's --master-port default, shared by all nodes
constexpr int kC10dDefaultPort = 29400;    // torchrun's c10d rendezvous port

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
    auto port = parse_whole_number(port_text);
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
std::shared_ptr<elastic::Rendezvous> make_rendezvous(const LaunchFlags& f,
                                                     const std::string& rdzv_backend,
                                                     std::pair<int, int> nodes,
                                                     const Endpoint& endpoint,
                                                     const elastic::LaunchOptions& o) {
  elastic::RendezvousOptions r;
  r.run_id = o.run_id;
  r.min_nodes = nodes.first;
  r.max_nodes = nodes.second;
  r.local_world_size = o.nproc_per_node;
  elastic::apply_rendezvous_conf(f.rdzv_conf, r);
  const bool etcd = rdzv_backend == "etcd";
  const int port = endpoint.port.value_or(etcd ? 2379 : kC10dDefaultPort);
  r.local_addr = !f.local_addr.empty() ? f.local_addr
                                       : route_address(endpoint.host, port,
                                                       {.what = "the rendezvous host",
                                                        .host_flag = "--rdzv-endpoint",
                                                        .local_flag = "--local-addr"});
  const std::string key = "/trainyard/rdzv/" + o.run_id + "/state";
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

// A setting as errors name it: "--nnodes 2" from the flag, "SLURM_NNODES=2" from a variable,
// "--nnodes 1 (the default)".
template <typename T>
std::string said(const elastic::Sourced<T>& setting, std::string_view flag) {
  if (setting.source == "default")
    return detail::concat(flag, " ", setting.value, " (the default)");
  if (setting.source.starts_with("--")) return detail::concat(setting.source, " ", setting.value);
  return detail::concat(setting.source, "=", setting.value);
}

// One setting as --dry-run prints it: "key: value (from source)".
struct ResolvedLine {
  std::string key, value, source;
  std::string text() const { return detail::concat(key, ": ", value, " (from ", source, ")"); }
};

// Note [Resolving a launch]
// Each setting of a node's place in the job comes from, in order: its flag; else the launch
// contract of the engine that started this process (elastic/launch_contract.h: PET_* variables,
// Slurm, SkyPilot, dstack, Volcano; detected in one table); else its default. Every value a
// contract gives goes through the flag's own checks, and errors name the variable it came from.
// An engine's rendezvous is static, but the host it names as node 0's also serves an elastic
// one: `--nnodes MIN:MAX` (or `--rdzv-backend c10d`) without --rdzv-endpoint under such an engine
// meets at c10d on that host's port 29400 (torchrun's), so `srun trainyard run --nnodes
// 1:$SLURM_NNODES -- ...` survives a lost node with no other flag. As with any c10d rendezvous,
// node 0's agent serves the store: losing node 0 ends the job (etcd does not).
struct Resolution {
  elastic::LaunchOptions options;
  std::vector<ResolvedLine> lines;
  std::string rdzv_backend;
  std::pair<int, int> nodes{1, 1};
  std::optional<Endpoint> endpoint;  // the dynamic rendezvous's
  bool under_engine = false;         // an engine's variables were read
};

// Resolves the flags into the launcher's options, checking what CLI11 cannot check alone. Starts
// nothing: the dynamic rendezvous is made by the caller (make_rendezvous).
Resolution resolve(const LaunchFlags& f, const CLI::App& cmd) {
  auto given = [&](const std::string& name) { return cmd.get_option(name)->count() > 0; };
  Resolution res;
  elastic::LaunchOptions& o = res.options;
  o = f.options;
  TY_CHECK(!o.command.empty(),
           "trainyard run needs a program to launch after its flags. HINT: trainyard run "
           "--nproc-per-node 2 -- python3 train.py");
  o.restart_backoff_max = std::max(o.restart_backoff_max, o.restart_backoff);
  // --standalone is one node whatever started it: an engine's variables (srun's, say) say nothing.
  const auto contract =
      f.standalone ? elastic::LaunchContract{} : elastic::detect_launch_contract();
  // The flag when given, else the contract's setting, else the default: the value and its source.
  auto pick = [&](const char* flag, const auto& from_contract, auto flag_value, auto fallback) {
    using T = decltype(flag_value);
    if (given(flag)) return elastic::Sourced<T>{flag_value, flag};
    if (from_contract) return elastic::Sourced<T>{T(from_contract->value), from_contract->source};
    return elastic::Sourced<T>{fallback, "default"};
  };

  const auto nproc = pick("--nproc-per-node", contract.nproc_per_node,
                          std::to_string(o.nproc_per_node), std::to_string(o.nproc_per_node));
  if (nproc.source != "--nproc-per-node") {  // the flag's value was checked by CLI11
    std::string value = nproc.value;
    const auto error = resolve_nproc_per_node(value);
    TY_CHECK(error.empty(), nproc.source, " (for --nproc-per-node) ", error);
    o.nproc_per_node = std::stoi(value);
  }
  const auto nnodes = pick("--nnodes", contract.nnodes, f.nnodes, f.nnodes);
  const auto nodes = parse_nnodes(nnodes.value);
  TY_CHECK(nodes.has_value(), nnodes.source, nnodes.source == "--nnodes" ? "" : " (for --nnodes)",
           " must be N or MIN:MAX with 1 <= MIN <= MAX, got '", nnodes.value, "'.");
  res.nodes = *nodes;
  o.nnodes = nodes->first;
  auto node_rank = pick("--node-rank", contract.node_rank, o.node_rank, o.node_rank);
  o.node_rank = node_rank.value;
  const auto master_addr =
      pick("--master-addr", contract.master_addr, o.master_addr, o.master_addr);
  o.master_addr = master_addr.value;
  auto backend = pick("--rdzv-backend", contract.rdzv_backend, f.rdzv_backend, f.rdzv_backend);
  auto rdzv_endpoint =
      pick("--rdzv-endpoint", contract.rdzv_endpoint, f.rdzv_endpoint, f.rdzv_endpoint);
  // See Note [Resolving a launch]: an engine's node 0 host serves an elastic rendezvous.
  if (!f.standalone && rdzv_endpoint.value.empty() && contract.master_addr) {
    if (backend.source == "default" && nodes->first != nodes->second)
      backend = {"c10d", detail::concat(said(nnodes, "--nnodes"), " (elastic)")};
    if (backend.value == "c10d") {
      rdzv_endpoint = {detail::concat(contract.master_addr->value, ":", kC10dDefaultPort),
                       detail::concat(contract.master_addr->source, ", port ", kC10dDefaultPort,
                                      " (c10d's default)")};
    }
  }
  auto run_id = pick("--rdzv-id", contract.run_id, o.run_id, o.run_id);

  TY_CHECK(backend.value == "static" || backend.value == "c10d" || backend.value == "etcd",
           backend.source, " is '", backend.value,
           "'; trainyard knows 'static', 'c10d' and 'etcd'. HINT: c10d needs no other service.");
  res.rdzv_backend = backend.value;
  std::optional<Endpoint>& endpoint = res.endpoint;
  if (!rdzv_endpoint.value.empty()) endpoint = parse_endpoint(rdzv_endpoint.value);
  TY_CHECK(f.rdzv_conf.empty() || res.rdzv_backend != "static",
           "--rdzv-conf configures the c10d and etcd rendezvous, not static. HINT: add "
           "--rdzv-backend c10d.");
  {
    elastic::RendezvousOptions check;  // reject a bad --rdzv-conf before anything starts
    elastic::apply_rendezvous_conf(f.rdzv_conf, check);
  }

  std::optional<elastic::Sourced<int>> port;
  if (given("--master-port"))
    port = elastic::Sourced<int>{o.master_port, "--master-port"};
  else if (contract.master_port)
    port = contract.master_port;
  std::string endpoint_text, endpoint_source;
  bool rank_at_rendezvous = false;
  if (f.standalone) {
    // torchrun --standalone: a c10d rendezvous on localhost with a fresh run id, one node.
    TY_CHECK(nodes->second == 1, "--standalone runs a single node, but ", said(nnodes, "--nnodes"),
             ". HINT: drop --standalone, or --nnodes.");
    if (!given("--rdzv-id")) run_id = {random_run_id(), "--standalone (a fresh id)"};
    res.rdzv_backend = "c10d";
    endpoint_text = "127.0.0.1:<free port>";
    endpoint_source = "--standalone";
  } else if (res.rdzv_backend == "c10d" || res.rdzv_backend == "etcd") {
    const bool local_only = nodes->second == 1 && !endpoint && res.rdzv_backend == "c10d";
    if (!local_only) {
      TY_CHECK(
          endpoint.has_value(), said(backend, "--rdzv-backend"), " with ", said(nnodes, "--nnodes"),
          " needs --rdzv-endpoint HOST[:PORT], the same on every node (",
          res.rdzv_backend == "etcd" ? "the etcd server" : "the host whose agent serves the store",
          ").");
      TY_CHECK(!given("--node-rank"),
               "--node-rank is for the static rendezvous; with --rdzv-backend ", res.rdzv_backend,
               " the rendezvous assigns node ranks. HINT: drop --node-rank.");
      endpoint_text = rdzv_endpoint.value;
      endpoint_source = rdzv_endpoint.source;
      // The rendezvous assigns node ranks: an engine's (SLURM_NODEID, say) does not count.
      node_rank = {0, detail::concat("the ", res.rdzv_backend, " rendezvous")};
      rank_at_rendezvous = true;
      o.node_rank = 0;
    } else {
      endpoint_text = "127.0.0.1:<free port>";
      endpoint_source = "default (one node)";
    }
  } else {
    TY_CHECK(nodes->first == nodes->second, said(nnodes, "--nnodes"),
             " asks for an elastic number of nodes, which needs a dynamic rendezvous. HINT: add "
             "--rdzv-backend c10d --rdzv-endpoint HOST:PORT (or etcd).");
    // static: the endpoint, when given, is the master (as torchrun's static rendezvous).
    std::string addr_source = master_addr.source;
    if (endpoint) {
      o.master_addr = endpoint->host;
      addr_source = rdzv_endpoint.source;
      if (endpoint->port && !port) port = elastic::Sourced<int>{*endpoint->port, addr_source};
    }
    if (o.nnodes > 1) {
      TY_CHECK((master_addr.source != "default" || endpoint) && node_rank.source != "default",
               said(nnodes, "--nnodes"),
               " with the static rendezvous needs --master-addr HOST --master-port PORT "
               "--node-rank K (K = 0..",
               o.nnodes - 1,
               ") on every node, or an engine's variables that give them (Slurm, Kubeflow, "
               "SkyPilot, dstack, Volcano). HINT: or let the nodes meet with --rdzv-backend c10d "
               "--rdzv-endpoint HOST:PORT.");
      if (!port) port = elastic::Sourced<int>{kStaticDefaultPort, "default"};
      TY_CHECK(port->value != 0, said(*port, "--master-port"),
               " (pick a free port) cannot work across ", o.nnodes,
               " nodes: each would pick its own. HINT: give every node the same --master-port.");
    }
    endpoint_text = detail::concat(
        o.master_addr, ":",
        port && port->value != 0 ? std::to_string(port->value) : std::string("<free port>"));
    endpoint_source =
        addr_source == (port ? port->source : addr_source)
            ? addr_source
            : detail::concat(addr_source, ", port ", port ? port->source : "a free one");
  }
  o.master_port = static_cast<std::uint16_t>(port ? port->value : 0);
  o.run_id = run_id.value;
  TY_CHECK(o.node_rank < o.nnodes, said(node_rank, "--node-rank"), " must be less than ",
           said(nnodes, "--nnodes"), ".");
  res.under_engine = !contract.engine.empty();
  res.lines = {{"engine", contract.engine.empty() ? "torchrun flags" : contract.engine,
                contract.engine.empty() ? "no engine's variables" : contract.engine_source},
               {"nnodes", nnodes.value, nnodes.source},
               {"node_rank",
                rank_at_rendezvous ? "assigned when the nodes meet" : std::to_string(o.node_rank),
                node_rank.source},
               {"nproc_per_node", std::to_string(o.nproc_per_node), nproc.source},
               {"rdzv_backend", res.rdzv_backend, f.standalone ? "--standalone" : backend.source},
               {"rdzv_endpoint", endpoint_text, endpoint_source},
               {"run_id", o.run_id, run_id.source}};
  return res;
}

}  // namespace

void add_run_command(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<LaunchFlags>();
  CLI::App* cmd = app.add_subcommand(
      "run", "Launch N ranks of a program on this node with the torchrun environment contract");
  cmd->footer(
      "Everything after the first positional argument (or after --) is the program and its "
      "arguments.\nExamples:\n  trainyard run --nproc-per-node 4 -- python3 train.py --lr 0.1\n"
      "  trainyard run --nproc-per-node 2 build/examples/mnist\nA flag not given comes from the "
      "variable shown, or for --nnodes, --node-rank, --nproc-per-node, --master-addr, "
      "--master-port, --rdzv-id, --rdzv-backend and --rdzv-endpoint from the launch contract of "
      "the engine that started this process: torchrun's PET_* variables (Kubeflow), Slurm, "
      "SkyPilot, dstack or Volcano. --dry-run prints what was resolved and from where.");
  cmd->positionals_at_end();

  add_launch_flags(*cmd, *flags);
  auto dry_run = std::make_shared<bool>(false);
  cmd->add_flag("--dry-run,--dry_run", *dry_run,
                "Print what the flags and the engine's variables resolve to (engine, nnodes, "
                "node_rank, nproc_per_node, rdzv_backend, rdzv_endpoint, run_id, each with its "
                "source) and exit without starting ranks");

  cmd->callback([flags, cmd, dry_run, &exit_code] {
    auto resolution = resolve(*flags, *cmd);
    if (*dry_run) {
      for (const auto& line : resolution.lines) std::printf("%s\n", line.text().c_str());
      exit_code = 0;
      return;
    }
    // Under an engine, say what came from its variables: the agent's own lines show only values.
    if (resolution.under_engine) {
      std::string settings;
      for (const auto& line : resolution.lines)
        settings += (settings.empty() ? "" : "; ") + line.text();
      logger("launcher")->info("Launch settings: {}", settings);
    }
    elastic::LaunchOptions& options = resolution.options;
    if (!flags->standalone && resolution.endpoint &&
        (resolution.rdzv_backend == "c10d" || resolution.rdzv_backend == "etcd"))
      options.rendezvous = make_rendezvous(*flags, resolution.rdzv_backend, resolution.nodes,
                                           *resolution.endpoint, options);
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
