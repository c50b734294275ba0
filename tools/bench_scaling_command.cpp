#include "tools/bench_scaling_command.h"

#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tools/launch_flags.h"
#include "tools/scaling_chart.h"
#include "trainyard/elastic/launcher.h"
#include "trainyard/elastic/subprocess.h"
#include "trainyard/error.h"
#include "trainyard/plan/scaling_model.h"
#include "trainyard/remove_tree.h"

namespace trainyard::cli {
namespace {

namespace fs = std::filesystem;
using plan::ScalingPoint;

struct ScalingFlags {
  std::string world_sizes = "1,2";
  std::string out = "scaling";
  double busbw_gbps = 0;  // 0: not given
  bool measure_busbw = false;
  std::string gradient_bytes;  // empty: from the run's config.json
  std::string predict;
  std::chrono::milliseconds timeout = std::chrono::minutes(30);  // per run
  std::string nodes_via;      // empty: local ranks; else a per-node launcher prefix
  std::string rdzv_endpoint;  // with nodes_via: HOST:PORT of node 0
  std::vector<std::string> command;
};

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The last `lines` lines of `text`, for an error message.
std::string tail(const std::string& text, int lines) {
  std::size_t pos = text.size();
  for (int n = 0; n <= lines && pos > 0; ++n) {
    const auto nl = text.rfind('\n', pos - 1);
    if (nl == std::string::npos) return text;
    pos = nl;
  }
  return text.substr(pos + 1);
}

// One process to run to completion, its stdout and stderr into `log`.
struct Logged {
  std::string shell;  // a /bin/sh -c command line, exec'ed
  fs::path log;
};

// Runs every process at once and waits at most `timeout` for all of them. When one fails (or the
// time is up) the others are stopped. Throws TimeoutError or Error (with the failed one's log's
// tail) unless all exit 0.
void run_all_logged(const std::vector<Logged>& procs, std::chrono::milliseconds timeout) {
  std::vector<elastic::Subprocess> children;
  for (const auto& p : procs)
    children.emplace_back(elastic::SubprocessOptions{
        .argv = {"/bin/sh", "-c",
                 "exec " + p.shell + " >" + elastic::shell_quote({p.log.string()}) + " 2>&1"}});
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto stop_all = [&] {
    for (auto& c : children) c.terminate(std::chrono::seconds(10));
  };
  while (true) {
    std::size_t done = 0;
    for (std::size_t i = 0; i < children.size(); ++i) {
      const auto status = children[i].poll();
      if (!status) continue;
      if (!status->success()) {
        stop_all();
        throw Error(detail::concat("`", procs[i].shell, "` ended with ", status->to_string(),
                                   ". The end of its output (all of it in ", procs[i].log.string(),
                                   "):\n", tail(read_text(procs[i].log), 15)));
      }
      ++done;
    }
    if (done == children.size()) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      stop_all();
      std::string logs;
      for (const auto& p : procs) logs += (logs.empty() ? "" : ", ") + p.log.string();
      throw TimeoutError(detail::concat(
          "`", procs.front().shell, "`", procs.size() > 1 ? " and the other nodes" : "",
          " did not finish within ", static_cast<double>(timeout.count()) / 1000,
          " s; stopped. The output is in ", logs, ". HINT: raise --timeout",
          procs.size() > 1 ? "; or, if the logs show the nodes waiting "
                             "for the rendezvous store, give --rdzv-endpoint an address of node 0, "
                             "whose agent serves it"
                           : "",
          "."));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// How a job of W ranks starts: `trainyard run --standalone` with W local ranks, or, with
// --nodes-via, W agents of one rank each, one per node, meeting at a c10d rendezvous.
struct Launch {
  std::string self;           // this trainyard binary
  std::string nodes_via;      // empty: local ranks
  std::string rdzv_endpoint;  // node 0's HOST:PORT, with nodes_via
  std::chrono::milliseconds timeout{0};

  bool nodes() const { return !nodes_via.empty(); }
  std::string unit(int w) const {
    return std::to_string(w) +
           (nodes() ? (w == 1 ? " node" : " nodes") : (w == 1 ? " rank" : " ranks"));
  }
};

// TEMPLATE with {node} and {nodes} replaced.
std::string expand_nodes_via(const std::string& tmpl, int node, int nodes) {
  std::string out;
  for (std::size_t i = 0; i < tmpl.size();) {
    if (tmpl.compare(i, 6, "{node}") == 0) {
      out += std::to_string(node);
      i += 6;
    } else if (tmpl.compare(i, 7, "{nodes}") == 0) {
      out += std::to_string(nodes);
      i += 7;
    } else {
      out += tmpl[i++];
    }
  }
  return out;
}

// Checks --nodes-via's placeholders: {node} and {nodes} only.
void validate_nodes_via(const std::string& tmpl) {
  static const std::regex kBrace(R"(\{[^{}]*\})");
  for (auto it = std::sregex_iterator(tmpl.begin(), tmpl.end(), kBrace);
       it != std::sregex_iterator(); ++it) {
    const std::string p = it->str();
    TY_CHECK(p == "{node}" || p == "{nodes}", "--nodes-via '", tmpl, "' has the placeholder ", p,
             "; it knows {node} (0..N-1) and {nodes} (N). HINT: --nodes-via 'ip netns exec "
             "myns{node}'.");
  }
}

// Runs `command` (a trainyard subcommand and its arguments) as a job of W ranks through `launch`;
// the output goes to LOG_STEM.log (local ranks) or LOG_STEM.nodeI.log (one per node). `id` names
// the rendezvous of a multi-node job.
void run_job(const Launch& launch,
             int world_size,
             const std::vector<std::string>& command,
             const fs::path& log_stem,
             const std::string& id) {
  std::vector<std::string> job = {launch.self};
  job.insert(job.end(), command.begin(), command.end());
  std::vector<Logged> procs;
  if (!launch.nodes()) {
    std::vector<std::string> argv = {
        launch.self, "run", "--nproc-per-node", std::to_string(world_size), "--standalone", "--"};
    argv.insert(argv.end(), job.begin(), job.end());
    procs.push_back({elastic::shell_quote(argv), log_stem.string() + ".log"});
  } else {
    // Node ranks come from the rendezvous; the agent whose address is the endpoint serves it.
    std::vector<std::string> argv = {launch.self,
                                     "run",
                                     "--nnodes",
                                     std::to_string(world_size),
                                     "--nproc-per-node",
                                     "1",
                                     "--rdzv-backend",
                                     "c10d",
                                     "--rdzv-endpoint",
                                     launch.rdzv_endpoint,
                                     "--rdzv-id",
                                     id,
                                     "--max-restarts",
                                     "0",
                                     "--"};
    argv.insert(argv.end(), job.begin(), job.end());
    for (int node = 0; node < world_size; ++node)
      procs.push_back(
          {expand_nodes_via(launch.nodes_via, node, world_size) + " " + elastic::shell_quote(argv),
           log_stem.string() + ".node" + std::to_string(node) + ".log"});
  }
  run_all_logged(procs, launch.timeout);
}

// The log of a job run by run_job that holds rank 0's output: the only one for local ranks; for
// nodes, whichever node's log has "[rank0]" (the rendezvous decides which node that is).
fs::path rank0_log(const Launch& launch, int world_size, const fs::path& log_stem) {
  if (!launch.nodes()) return log_stem.string() + ".log";
  for (int node = 0; node < world_size; ++node) {
    const fs::path log = log_stem.string() + ".node" + std::to_string(node) + ".log";
    if (read_text(log).find("[rank0]") != std::string::npos) return log;
  }
  return log_stem.string() + ".node0.log";
}

// Rank 0's "# Avg bus bandwidth : X" of an all_reduce sweep over two ranks (local ranks, or two
// nodes with --nodes-via), GB/s.
double measure_busbw(const Launch& launch, const fs::path& out, const std::string& id) {
  const fs::path stem = out / "busbw";
  std::printf("Measuring all_reduce bus bandwidth over %s (log: %s%s)\n", launch.unit(2).c_str(),
              stem.string().c_str(), launch.nodes() ? ".node*.log" : ".log");
  std::fflush(stdout);
  run_job(launch, 2,
          {"bench", "collectives", "--ops", "all_reduce", "--min-bytes", "1M", "--max-bytes", "64M",
           "--check", "0"},
          stem, id);
  const fs::path log = rank0_log(launch, 2, stem);
  static const std::regex kAvg(R"(# Avg bus bandwidth\s*:\s*([0-9.eE+-]+))");
  std::smatch m;
  const std::string text = read_text(log);
  TY_CHECK_T(Error, std::regex_search(text, m, kAvg), "No \"# Avg bus bandwidth\" line in ",
             log.string(), ".");
  const double busbw = std::stod(m[1]);
  TY_CHECK_T(Error, busbw > 0, "The measured bus bandwidth is ", busbw, " GB/s in ", log.string(),
             ". HINT: give --busbw.");
  return busbw;
}

struct Measured {
  ScalingPoint point;
  std::optional<std::int64_t> parameters;  // config.json's "parameters", when the recipe gives it
};

// The run's result.json: epoch time = train_time_s / epochs, throughput = train_samples_per_s,
// step time = train_time_s / global_step.
Measured read_result(const fs::path& run_dir, int world_size) {
  const fs::path path = run_dir / "result.json";
  TY_CHECK_T(Error, fs::exists(path), "No result at ", path.string(),
             ": the run did not finish. HINT: its log beside the folder names the cause.");
  nlohmann::json r;
  try {
    r = nlohmann::json::parse(read_text(path));
  } catch (const nlohmann::json::exception& e) {
    throw CorruptDataError(path.string() + " is not valid JSON: " + e.what());
  }
  TY_CHECK_T(Error, r.contains("train_time_s") && r.contains("train_samples_per_s"), path.string(),
             " has no train_time_s or train_samples_per_s: the recipe does not report "
             "throughput, so it cannot be benchmarked for scaling.");
  const auto& config = r.value("config", nlohmann::json::object());
  const int epochs = config.value("epochs", 1);
  const double train_time = r.at("train_time_s").get<double>();
  const auto steps = r.value("global_step", std::int64_t{0});
  Measured m{.point = {.world_size = world_size,
                       .epoch_time_s = train_time / std::max(epochs, 1),
                       .samples_per_s = r.at("train_samples_per_s").get<double>(),
                       .step_time_s = steps > 0 ? train_time / static_cast<double>(steps) : 0}};
  for (const char* key : {"parameters", "num_parameters", "parameter_count"})
    if (config.contains(key)) m.parameters = config.at(key).get<std::int64_t>();
  TY_CHECK_T(Error, m.point.epoch_time_s > 0 && m.point.samples_per_s > 0, path.string(),
             " reports train_time_s ", train_time, " and train_samples_per_s ",
             m.point.samples_per_s, "; both must be > 0.");
  return m;
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

void write_file(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    out << text;
    TY_CHECK_T(Error, out.good(), "Could not write ", tmp.string(), ".");
  }
  fs::rename(tmp, path);
}

int run_scaling(const ScalingFlags& f) {
  // Validate everything before the first (long) run.
  const auto sizes_unsorted = plan::parse_world_sizes(f.world_sizes, "--world-sizes");
  auto sizes = sizes_unsorted;
  std::sort(sizes.begin(), sizes.end());
  TY_CHECK(!sizes.empty() && sizes.front() == 1,
           "--world-sizes must include 1: efficiency is relative to one rank; got '", f.world_sizes,
           "'.");
  if (!f.nodes_via.empty()) {
    validate_nodes_via(f.nodes_via);
    TY_CHECK(!f.rdzv_endpoint.empty(),
             "--nodes-via needs --rdzv-endpoint HOST:PORT: an address of node 0 (the node "
             "{node} = 0 reaches), where its agent serves the c10d rendezvous store, reachable "
             "from every node. HINT: --nodes-via 'ip netns exec ns{node}' --rdzv-endpoint "
             "198.18.0.1:29400.");
  } else {
    TY_CHECK(f.rdzv_endpoint.empty(),
             "--rdzv-endpoint is for runs across nodes; without --nodes-via every run is local "
             "ranks with their own rendezvous. HINT: add --nodes-via TEMPLATE, or drop "
             "--rdzv-endpoint.");
  }
  const auto predict = plan::parse_world_sizes(f.predict, "--predict");
  TY_CHECK(f.busbw_gbps >= 0, "--busbw must be > 0 GB/s, got ", f.busbw_gbps, ".");
  TY_CHECK(!(f.busbw_gbps > 0 && f.measure_busbw), "Give --busbw or --measure-busbw, not both.");
  TY_CHECK(!f.command.empty(),
           "trainyard bench scaling needs the recipe to run after `--`. HINT: trainyard bench "
           "scaling --world-sizes 1,2 -- train fashion-mnist --epochs 1 --limit 1024");
  std::optional<std::int64_t> gradient_bytes;
  if (!f.gradient_bytes.empty())
    gradient_bytes = plan::parse_byte_count(f.gradient_bytes, "--gradient-bytes");

  const Launch launch{.self = elastic::self_executable(),
                      .nodes_via = f.nodes_via,
                      .rdzv_endpoint = f.rdzv_endpoint,
                      .timeout = f.timeout};
  const fs::path out = fs::absolute(f.out);
  const fs::path runs = out / "runs";
  fs::create_directories(runs);
  const std::string recipe = elastic::shell_quote(f.command);
  const std::string id = "scaling-" + std::to_string(getpid());  // the rendezvous' run ids

  // One run per world size, each a fresh run folder (an old one would be resumed).
  std::vector<ScalingPoint> points;
  for (int w : sizes) {
    const std::string name = "w" + std::to_string(w);
    std::error_code removed;
    remove_tree((runs / name).string(), removed);
    TY_CHECK_T(Error, !removed, "Cannot remove the old run folder ", (runs / name).string(), ": ",
               removed.message(), ". HINT: check its permissions, or pick another --out.");
    std::vector<std::string> command = f.command;
    command.insert(command.end(), {"--storage", runs.string(), "--name", name});
    std::printf("Running %s at %s (log: %s%s)\n", recipe.c_str(), launch.unit(w).c_str(),
                (runs / name).string().c_str(), launch.nodes() ? ".node*.log" : ".log");
    std::fflush(stdout);
    run_job(launch, w, command, runs / name, id + "-" + name);
    const Measured m = read_result(runs / name, w);
    if (!gradient_bytes && m.parameters) gradient_bytes = *m.parameters * 4;  // fp32 gradients
    points.push_back(m.point);
  }
  const ScalingPoint& one = points.front();

  // The model, when it has its three inputs. See Note [Scaling model] in scaling_model.cpp.
  double busbw = f.busbw_gbps;
  if (f.measure_busbw) busbw = measure_busbw(launch, out, id + "-busbw");
  std::optional<plan::ScalingModelOptions> model;
  std::string no_model;
  if (busbw <= 0)
    no_model = "no bus bandwidth (give --busbw or --measure-busbw)";
  else if (!gradient_bytes)
    no_model = "no gradient size (give --gradient-bytes)";
  else if (one.step_time_s <= 0)
    no_model = "the 1-rank result has no global_step";
  else
    model = plan::ScalingModelOptions{
        .compute_time_s = one.step_time_s, .gradient_bytes = *gradient_bytes, .busbw_gbps = busbw};

  // The table, the JSON and the charts.
  nlohmann::ordered_json json;
  json["command"] = f.command;
  json["launch"] = launch.nodes() ? nlohmann::ordered_json{{"workers", "nodes of 1 rank each"},
                                                           {"nodes_via", f.nodes_via},
                                                           {"rdzv_endpoint", f.rdzv_endpoint}}
                                  : nlohmann::ordered_json{{"workers", "local ranks"}};
  json["efficiency"] = "samples_per_s(W) / (W x samples_per_s(1)), per-rank batch fixed";
  json["model"] = model ? nlohmann::ordered_json{{"compute_time_s", model->compute_time_s},
                                                 {"gradient_bytes", model->gradient_bytes},
                                                 {"busbw_gbps", model->busbw_gbps},
                                                 {"formula",
                                                  "T(W) = compute + 2(W-1)/W x gradient_bytes / "
                                                  "busbw (ring all-reduce, no overlap); "
                                                  "efficiency = T(1) / T(W)"}}
                        : nlohmann::ordered_json(nullptr);
  auto& rows = json["points"] = nlohmann::ordered_json::array();
  const std::string workers = launch.nodes() ? "nodes" : "workers";  // the charts' x axis
  const std::string x_label = launch.nodes() ? "nodes of 1 rank" : "workers";
  ScalingChart time_chart{
      .title = "Epoch time against " + workers, .y_label = "epoch time (s)", .x_label = x_label};
  ScalingChart rate_chart{.title = "Throughput against " + workers,
                          .y_label = "samples/s",
                          .x_label = x_label,
                          .ideal_falls = false};

  std::printf("\nW = %s\n%4s %15s %12s %11s %10s\n",
              launch.nodes() ? "nodes of 1 rank each (--nodes-via)" : "local ranks", "W",
              "epoch time (s)", "samples/s", "efficiency", "predicted");
  for (const auto& p : points) {
    const double eff = plan::measured_efficiency(p, one);
    std::optional<double> pred;
    if (model) pred = plan::predicted_efficiency(*model, p.world_size);
    std::printf("%4d %15.3f %12.1f %11.3f %10s\n", p.world_size, p.epoch_time_s, p.samples_per_s,
                eff, pred ? fmt("%.3f", *pred).c_str() : "-");
    rows.push_back({{"world_size", p.world_size},
                    {"epoch_time_s", p.epoch_time_s},
                    {"samples_per_s", p.samples_per_s},
                    {"step_time_s", p.step_time_s},
                    {"efficiency", eff},
                    {"predicted_efficiency", pred ? nlohmann::ordered_json(*pred) : nullptr}});
    time_chart.measured.push_back({p.world_size, p.epoch_time_s});
    rate_chart.measured.push_back({p.world_size, p.samples_per_s});
  }
  auto& predictions = json["predictions"] = nlohmann::ordered_json::array();
  if (model) {
    // Predicted points: every world size but 1 (where model and measurement agree by definition).
    std::vector<int> all = sizes;
    all.insert(all.end(), predict.begin(), predict.end());
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    for (int w : all) {
      if (w == 1) continue;
      const double pred = plan::predicted_efficiency(*model, w);
      const double epoch = one.epoch_time_s / (w * pred);
      const double rate = one.samples_per_s * w * pred;
      if (std::find(sizes.begin(), sizes.end(), w) == sizes.end())
        std::printf("%4d %15s %12s %11s %10.3f\n", w, fmt("%.3f*", epoch).c_str(),
                    fmt("%.1f*", rate).c_str(), "-", pred);
      predictions.push_back({{"world_size", w},
                             {"predicted_efficiency", pred},
                             {"predicted_epoch_time_s", epoch},
                             {"predicted_samples_per_s", rate}});
      time_chart.predicted.push_back({w, epoch});
      rate_chart.predicted.push_back({w, rate});
    }
  }
  std::printf("\nefficiency = samples/s(W) / (W x samples/s(1)), the per-rank batch fixed.\n");
  if (model) {
    std::printf(
        "predicted  = T(1) / T(W), T(W) = %.4f s compute + 2(W-1)/W x %.1f MB / %.3g GB/s "
        "(ring all-reduce, no overlap with backward: a lower bound); * = predicted.\n",
        model->compute_time_s, static_cast<double>(model->gradient_bytes) / 1e6, model->busbw_gbps);
  } else {
    std::printf("No prediction: %s.\n", no_model.c_str());
  }
  write_file(out / "scaling.json", json.dump(2) + "\n");
  write_file(out / "scaling.svg", chart_svg(time_chart));
  write_chart_png(time_chart, (out / "scaling.png").string());
  write_file(out / "throughput.svg", chart_svg(rate_chart));
  write_chart_png(rate_chart, (out / "throughput.png").string());
  std::printf("Wrote %s/scaling.{json,svg,png} and throughput.{svg,png}\n", out.string().c_str());
  return 0;
}

}  // namespace

void add_bench_scaling_command(CLI::App& bench, int& exit_code) {
  static ScalingFlags f;  // CLI11 binds flags to storage that outlives parsing
  auto* c = bench.add_subcommand(
      "scaling",
      "Run a recipe at several world sizes (local ranks, through `trainyard run --standalone`; "
      "or with --nodes-via, as that many nodes of one rank each, an agent per node meeting at a "
      "c10d rendezvous), print epoch time, throughput and weak-scaling efficiency with the "
      "efficiency a ring "
      "all-reduce model predicts, and write OUT/scaling.json and charts (scaling.svg/png: epoch "
      "time; throughput.svg/png). Example: trainyard bench scaling --world-sizes 1,2 --busbw 2 "
      "--predict 4,8 -- train fashion-mnist --epochs 1 --limit 1024 --threads 1. Across nodes: "
      "... --nodes-via 'ip netns exec ns{node}' --rdzv-endpoint 198.18.0.1:29400 -- train ...");
  c->positionals_at_end();
  c->add_option("--world-sizes", f.world_sizes,
                "Comma-separated ranks per run (nodes with --nodes-via); must include 1")
      ->capture_default_str();
  c->add_option("--out", f.out, "Folder for runs/, their logs, scaling.json and the charts")
      ->capture_default_str();
  c->add_option("--busbw", f.busbw_gbps,
                "all_reduce bus bandwidth for the model, GB/s (nccl-tests' busbw, as `trainyard "
                "bench collectives` prints it)");
  c->add_flag("--measure-busbw", f.measure_busbw,
              "Measure the bus bandwidth after the runs: trainyard bench collectives --ops "
              "all_reduce over 2 local ranks (2 nodes with --nodes-via), 1M to 64M, its Avg bus "
              "bandwidth");
  c->add_option("--gradient-bytes", f.gradient_bytes,
                "Bytes all-reduced per step (K, M, G: powers of 1024); default: 4 x the "
                "\"parameters\" of the run's config.json");
  c->add_option("--predict", f.predict, "Comma-separated world sizes to predict efficiency at");
  add_seconds_option(*c, f.timeout,
                     {.names = "--timeout",
                      .description = "Seconds each run may take before it is stopped",
                      .min = 0.001,
                      .max = 1e6});
  c->add_option(
       "--nodes-via", f.nodes_via,
       "Run each world size N as N nodes: N `trainyard run --nnodes N --nproc-per-node 1 "
       "--rdzv-backend c10d` agents, each started through this shell command prefix with "
       "{node} (0..N-1) and {nodes} (N) replaced, e.g. 'ip netns exec ns{node}' (--out must be a "
       "folder every node sees at the same path)")
      ->type_name("TEMPLATE");
  c->add_option("--rdzv-endpoint", f.rdzv_endpoint,
                "With --nodes-via: node 0's HOST:PORT, where its agent serves the rendezvous "
                "store")
      ->type_name("HOST:PORT");
  c->add_option("command", f.command,
                "The trainyard subcommand to run as each rank, then its arguments (after --)")
      ->expected(1, -1);
  c->callback([&exit_code] { exit_code = run_scaling(f); });
}

}  // namespace trainyard::cli
