#include "tools/launch_flags.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "trainyard/cluster/node_resources.h"
#include "trainyard/cpu_count.h"
#include "trainyard/env.h"
#include "trainyard/error.h"
#include "trainyard/seconds.h"

namespace trainyard::cli {
namespace {

constexpr int kMaxNprocPerNode = 4096;

std::string from_where(const char* env) {
  return env == nullptr ? "" : detail::concat(" (from the flag or ", env, ")");
}

// A validator for a whole number in [min, max] whose message names the variable the value may
// have come from and carries a hint.
CLI::Validator whole_number(int min, int max, const char* env, const std::string& hint) {
  return CLI::Validator(
      [=](std::string& value) -> std::string {
        auto n = parse_whole_number(value);
        if (n && *n >= min && *n <= max) return {};
        return detail::concat("must be a whole number between ", min, " and ", max, ", got '",
                              value, "'", from_where(env), ". HINT: ", hint);
      },
      "");
}

// --nproc-per-node's value (from the flag or a launch contract) through resolve_nproc_per_node.
CLI::Validator nproc_per_node_value() {
  return CLI::Validator([](std::string& value) { return resolve_nproc_per_node(value); }, "");
}

// A number of seconds as a person writes it: 30, 0.5, 1000000.
std::string number_text(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6f", x);
  std::string s = text;
  s.erase(s.find_last_not_of('0') + 1);  // "30.000000" -> "30."
  if (s.back() == '.') s.pop_back();
  return s;
}

std::string seconds_text(std::chrono::milliseconds ms) {
  return number_text(static_cast<double>(ms.count()) / 1000.0);
}

}  // namespace

void add_restart_flags(CLI::App& cmd, elastic::LaunchOptions& o) {
  cmd.add_option("--max-restarts,--max_restarts", o.max_restarts,
                 "Restarts allowed before failing (TORCHELASTIC_MAX_RESTARTS)")
      ->envname(kPetMaxRestartsEnv)
      ->check(whole_number(0, elastic::kMaxRestartsLimit, kPetMaxRestartsEnv,
                           "how many times to restart the ranks, e.g. 3."))
      ->capture_default_str();
  add_seconds_option(cmd, o.restart_backoff,
                     {.names = "--restart-backoff,--restart_backoff",
                      .description = "Seconds to wait before the first restart; doubles for each "
                                     "further restart (0: restart at once)",
                      .max = elastic::kMaxRestartBackoff.count(),
                      .env = kRestartBackoffEnv});
  add_seconds_option(cmd, o.restart_backoff_max,
                     {.names = "--restart-backoff-max,--restart_backoff_max",
                      .description = "The longest wait before a restart, in seconds",
                      .max = elastic::kMaxRestartBackoff.count(),
                      .env = kRestartBackoffMaxEnv});
  add_seconds_option(cmd, o.hang_timeout,
                     {.names = "--hang-timeout,--hang_timeout",
                      .description = "Restart (or stop) the ranks when one that reports progress "
                                     "(trainyard's heartbeat) makes none for this many seconds; "
                                     "0: off",
                      .max = static_cast<double>(elastic::kMaxHangTimeout.count()),
                      .env = kPetHangTimeoutEnv,
                      .fallback_env = kHangTimeoutEnv,
                      .hint = "0 turns the watchdog off."});
}

std::string resolve_nproc_per_node(std::string& value) {
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
  auto n = parse_whole_number(value);
  if (n && *n >= 1 && *n <= kMaxNprocPerNode) return {};
  return detail::concat("must be a whole number between 1 and ", kMaxNprocPerNode,
                        ", or auto, cpu or gpu; got '", value,
                        "'. HINT: the number of ranks on this node, e.g. 4, or auto for one per "
                        "GPU (else per CPU).");
}

std::optional<int> parse_whole_number(std::string_view text) {
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::optional<std::pair<int, int>> parse_nnodes(const std::string& text) {
  const auto colon = text.find(':');
  auto min = parse_whole_number(std::string_view(text).substr(0, colon));
  auto max = colon == std::string::npos
                 ? min
                 : parse_whole_number(std::string_view(text).substr(colon + 1));
  if (!min || !max || *min < 1 || *max < *min) return std::nullopt;
  return std::pair{*min, *max};
}

CLI::Option* add_seconds_option(CLI::App& cmd,
                                std::chrono::milliseconds& target,
                                const SecondsFlag& flag) {
  const std::string sources =
      flag.env == nullptr ? ""
      : flag.fallback_env == nullptr
          ? detail::concat(" (from the flag or ", flag.env, ")")
          : detail::concat(" (from the flag, ", flag.env, " or ", flag.fallback_env, ")");
  const std::string hint = flag.hint.empty() ? "" : " HINT: " + flag.hint;
  auto message = [=](const std::string& value) {
    return detail::concat("must be a number of seconds in [", number_text(flag.min), ", ",
                          number_text(flag.max), "], got '", value, "'", sources, ".", hint);
  };
  if (flag.fallback_env != nullptr) {
    const char* value = std::getenv(flag.fallback_env);
    if (value != nullptr && *value != '\0') {
      if (auto ms = parse_seconds(value, flag.min, flag.max)) {
        target = *ms;
      } else {
        const std::string error = detail::concat(flag.fallback_env, " ", message(value));
        cmd.parse_complete_callback([error] { throw CLI::ValidationError(error); });
      }
    }
  }
  auto* option = cmd.add_option_function<std::string>(
      flag.names,
      [&target, min = flag.min, max = flag.max](const std::string& value) {
        target = *parse_seconds(value, min, max);  // the check below passed
      },
      flag.description);
  option->check(CLI::Validator(
      [=](std::string& value) -> std::string {
        return parse_seconds(value, flag.min, flag.max) ? "" : message(value);
      },
      ""));
  option->type_name("SECONDS")->default_str(seconds_text(target));
  if (flag.env != nullptr) option->envname(flag.env);
  return option;
}

void add_launch_flags(CLI::App& cmd, LaunchFlags& flags) {
  auto& o = flags.options;
  cmd.add_option("--nproc-per-node,--nproc_per_node", o.nproc_per_node,
                 "Number of ranks to start on this node: N, or auto (one per GPU, else per "
                 "usable CPU), cpu or gpu")
      ->transform(nproc_per_node_value())
      ->type_name("N|auto|cpu|gpu")
      ->capture_default_str();
  cmd.add_option("--nnodes", flags.nnodes, "Number of nodes: N, or MIN:MAX (elastic)")
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            if (parse_nnodes(value)) return {};
            return "must be N or MIN:MAX with 1 <= MIN <= MAX, got '" + value +
                   "'. HINT: --nnodes 1 for this node alone.";
          },
          ""))
      ->type_name("N|MIN:MAX")
      ->capture_default_str();
  cmd.add_option("--node-rank,--node_rank", o.node_rank,
                 "This node's rank among the nodes (static rendezvous)")
      ->check(whole_number(0, 1 << 20, nullptr, "0 for the first node, 1 for the second, ..."))
      ->capture_default_str();
  cmd.add_option("--master-addr,--master_addr", o.master_addr,
                 "Address of the node that hosts rank 0 (MASTER_ADDR)")
      ->capture_default_str();
  cmd.add_option("--master-port,--master_port", o.master_port,
                 "Port of rank 0's store (MASTER_PORT); 0 or unset on one node picks a free one")
      ->check(whole_number(0, 65535, nullptr, "a TCP port, e.g. 29500, or 0 for a free one."));
  cmd.add_option("--rdzv-id,--rdzv_id", o.run_id, "Run id (TORCHELASTIC_RUN_ID)")
      ->capture_default_str();
  cmd.add_option("--rdzv-backend,--rdzv_backend", flags.rdzv_backend,
                 "Rendezvous backend: static, c10d (a store served by one agent) or etcd")
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
  cmd.add_option("--rdzv-endpoint,--rdzv_endpoint", flags.rdzv_endpoint,
                 "Rendezvous endpoint HOST[:PORT] (c10d: 29400, etcd: 2379 by default)");
  cmd.add_option("--rdzv-conf,--rdzv_conf", flags.rdzv_conf,
                 "Rendezvous settings key=value,...: join_timeout, last_call_timeout, "
                 "keep_alive_interval, keep_alive_max_attempt, backend_timeout (seconds)")
      ->envname(kPetRdzvConfEnv);
  cmd.add_option("--local-addr,--local_addr", flags.local_addr,
                 "This node's address for the other nodes (default: the one on the route to "
                 "the rendezvous endpoint)")
      ->envname(kPetLocalAddrEnv);
  cmd.add_flag("--standalone", flags.standalone,
               "Single-node job with a local rendezvous, a free port and a fresh run id")
      ->envname(kPetStandaloneEnv);
  add_restart_flags(cmd, o);
  add_seconds_option(cmd, o.monitor_interval,
                     {.names = "--monitor-interval,--monitor_interval",
                      .description = "Seconds between the agent's checks of the rendezvous while "
                                     "ranks run (torchrun's flag; rank exits are seen at once)",
                      .min = 0.01,
                      .max = 3600,
                      .env = kPetMonitorIntervalEnv});
  cmd.add_option("--log-dir,--log_dir", o.log_dir,
                 "Also write each rank's output to LOG_DIR/RUN_ID/attempt_N/LOCAL_RANK/")
      ->envname(kPetLogDirEnv);
  cmd.add_option("--metrics-port,--metrics_port", flags.metrics_port,
                 "Serve this node's and its ranks' metrics for Prometheus at "
                 "http://METRICS_BIND:PORT/metrics while the ranks run (0: a free port, printed)")
      ->envname(kPetMetricsPortEnv)
      ->check(CLI::Range(0, 65535));
  cmd.add_option("--metrics-bind,--metrics_bind", flags.metrics_bind,
                 "Address the metrics endpoint listens on (0.0.0.0: every interface)")
      ->capture_default_str();
  cmd.add_option("--role", o.role, "Role name of the ranks (ROLE_NAME)")->capture_default_str();
  cmd.add_flag_callback(
      "--no-prefix,--no_prefix", [&o] { o.prefix_output = false; },
      "Forward the ranks' output without the \"[rankN]: \" prefix");
  cmd.add_option("command", o.command, "The program to launch, then its arguments")
      ->expected(1, -1);
}

}  // namespace trainyard::cli
