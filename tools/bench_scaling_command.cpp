#include "tools/bench_scaling_command.h"

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
#include <vector>

#include "tools/scaling_chart.h"
#include "trainyard/elastic/launcher.h"
#include "trainyard/elastic/subprocess.h"
#include "trainyard/error.h"
#include "trainyard/plan/scaling_model.h"

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
  double timeout_s = 1800;  // per run
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

// Runs argv to completion with stdout and stderr into `log`, at most timeout_s. Throws
// TimeoutError or Error (with the log's tail) unless it exits 0.
void run_logged(const std::vector<std::string>& argv, const fs::path& log, double timeout_s) {
  elastic::Subprocess child(
      elastic::SubprocessOptions{.argv = {"/bin/sh", "-c",
                                          "exec " + elastic::shell_quote(argv) + " >" +
                                              elastic::shell_quote({log.string()}) + " 2>&1"}});
  const auto status =
      child.wait_for(std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000)));
  if (!status) {
    child.terminate(std::chrono::seconds(10));
    throw TimeoutError("`" + elastic::shell_quote(argv) + "` did not finish within " +
                       std::to_string(timeout_s) + " s; it was stopped. Its output is in " +
                       log.string() + ". HINT: raise --timeout.");
  }
  TY_CHECK_T(Error, status->success(), "`", elastic::shell_quote(argv), "` ended with ",
             status->to_string(), ". The end of its output (all of it in ", log.string(), "):\n",
             tail(read_text(log), 15));
}

// Rank 0's "# Avg bus bandwidth : X" of an all_reduce sweep over two local ranks, GB/s.
double measure_busbw(const std::string& self, const fs::path& out, double timeout_s) {
  const fs::path log = out / "busbw.log";
  std::printf("Measuring all_reduce bus bandwidth over 2 local ranks (log: %s)\n",
              log.string().c_str());
  std::fflush(stdout);
  run_logged(
      {self, "run", "--nproc-per-node", "2", "--standalone", "--", self, "bench", "collectives",
       "--ops", "all_reduce", "--min-bytes", "1M", "--max-bytes", "64M", "--check", "0"},
      log, timeout_s);
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
  const auto predict = plan::parse_world_sizes(f.predict, "--predict");
  TY_CHECK(f.busbw_gbps >= 0, "--busbw must be > 0 GB/s, got ", f.busbw_gbps, ".");
  TY_CHECK(!(f.busbw_gbps > 0 && f.measure_busbw), "Give --busbw or --measure-busbw, not both.");
  TY_CHECK(f.timeout_s > 0, "--timeout must be > 0 seconds, got ", f.timeout_s, ".");
  TY_CHECK(!f.command.empty(),
           "trainyard bench scaling needs the recipe to run after `--`. HINT: trainyard bench "
           "scaling --world-sizes 1,2 -- train fashion-mnist --epochs 1 --limit 1024");
  std::optional<std::int64_t> gradient_bytes;
  if (!f.gradient_bytes.empty())
    gradient_bytes = plan::parse_byte_count(f.gradient_bytes, "--gradient-bytes");

  const std::string self = elastic::self_executable();
  const fs::path out = fs::absolute(f.out);
  const fs::path runs = out / "runs";
  fs::create_directories(runs);
  const std::string recipe = elastic::shell_quote(f.command);

  // One run per world size, each a fresh run folder (an old one would be resumed).
  std::vector<ScalingPoint> points;
  for (int w : sizes) {
    const std::string name = "w" + std::to_string(w);
    fs::remove_all(runs / name);
    std::vector<std::string> argv = {
        self, "run", "--nproc-per-node", std::to_string(w), "--standalone", "--", self};
    argv.insert(argv.end(), f.command.begin(), f.command.end());
    argv.insert(argv.end(), {"--storage", runs.string(), "--name", name});
    std::printf("Running %s at %d rank(s) (log: %s)\n", recipe.c_str(), w,
                (runs / (name + ".log")).string().c_str());
    std::fflush(stdout);
    run_logged(argv, runs / (name + ".log"), f.timeout_s);
    const Measured m = read_result(runs / name, w);
    if (!gradient_bytes && m.parameters) gradient_bytes = *m.parameters * 4;  // fp32 gradients
    points.push_back(m.point);
  }
  const ScalingPoint& one = points.front();

  // The model, when it has its three inputs. See Note [Scaling model] in scaling_model.cpp.
  double busbw = f.busbw_gbps;
  if (f.measure_busbw) busbw = measure_busbw(self, out, f.timeout_s);
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
  ScalingChart time_chart{.title = "Epoch time against workers", .y_label = "epoch time (s)"};
  ScalingChart rate_chart{
      .title = "Throughput against workers", .y_label = "samples/s", .ideal_falls = false};

  std::printf("\n%4s %15s %12s %11s %10s\n", "W", "epoch time (s)", "samples/s", "efficiency",
              "predicted");
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
      "Run a recipe at several world sizes (local ranks, through `trainyard run --standalone`), "
      "print epoch time, throughput and weak-scaling efficiency with the efficiency a ring "
      "all-reduce model predicts, and write OUT/scaling.json and charts (scaling.svg/png: epoch "
      "time; throughput.svg/png). Example: trainyard bench scaling --world-sizes 1,2 --busbw 2 "
      "--predict 4,8 -- train fashion-mnist --epochs 1 --limit 1024 --threads 1");
  c->positionals_at_end();
  c->add_option("--world-sizes", f.world_sizes, "Comma-separated ranks per run; must include 1")
      ->capture_default_str();
  c->add_option("--out", f.out, "Folder for runs/, their logs, scaling.json and the charts")
      ->capture_default_str();
  c->add_option("--busbw", f.busbw_gbps,
                "all_reduce bus bandwidth for the model, GB/s (nccl-tests' busbw, as `trainyard "
                "bench collectives` prints it)");
  c->add_flag("--measure-busbw", f.measure_busbw,
              "Measure the bus bandwidth first: trainyard bench collectives --ops all_reduce over "
              "2 local ranks, 1M to 64M, its Avg bus bandwidth");
  c->add_option("--gradient-bytes", f.gradient_bytes,
                "Bytes all-reduced per step (K, M, G: powers of 1024); default: 4 x the "
                "\"parameters\" of the run's config.json");
  c->add_option("--predict", f.predict, "Comma-separated world sizes to predict efficiency at");
  c->add_option("--timeout", f.timeout_s, "Seconds each run may take before it is stopped")
      ->capture_default_str();
  c->add_option("command", f.command,
                "The trainyard subcommand to run as each rank, then its arguments (after --)")
      ->expected(1, -1);
  c->callback([&exit_code] { exit_code = run_scaling(f); });
}

}  // namespace trainyard::cli
