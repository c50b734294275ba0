// The worker daemon; see worker.h.
//
// Note [Worker and head]
// The worker owns its jobs; the head owns the decisions. Every heartbeat carries a report of each
// job the worker holds (running, or finished and not yet acknowledged) and gets back new
// assignments and stop requests. Nothing the worker knows lives only in memory:
//   - state_dir/node_id is the node's identity across restarts of the worker;
//   - state_dir/jobs/<id>/assignment.json is written before a job's agent starts;
//   - state_dir/jobs/<id>/output.log spools every line a rank prints, numbered per job and node;
//     state_dir/jobs/<id>/shipped holds the number of the first line the head has not yet stored.
//     Lines are shipped in order with their numbers, and the head stores (job, node, number) once,
//     so a resend after a lost answer, a head restart or a worker restart stores nothing twice;
//   - state_dir/jobs/<id>/report.json is the job's final report, written when its agent ends.
// A job leaves the worker once its final report went out in a heartbeat the head answered and
// every line was shipped. A worker that restarts finds its job folders: a job with a final report
// is reported again, one without lost its ranks with the old worker (they die with their agent)
// and is reported failed, saying so.
// While the head is unreachable the ranks keep training: the agents' rendezvous ride the outage
// out for head_outage_timeout (Note [Backend outages]), the spool grows, and heartbeats retry with
// backoff. A head that answers "not registered" (it restarted, or declared this node dead) gets a
// new registration carrying every job's report, from which it reconciles its state.
#include "trainyard/cluster/worker.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "trainyard/cluster/api.h"
#include "trainyard/cluster/head_client.h"
#include "trainyard/cluster/state_dir.h"
#include "trainyard/cluster/wire.h"
#include "trainyard/comm/address.h"
#include "trainyard/elastic/agent.h"
#include "trainyard/elastic/agent_metrics.h"
#include "trainyard/elastic/head_backend.h"
#include "trainyard/elastic/launcher.h"
#include "trainyard/elastic/rendezvous.h"
#include "trainyard/env.h"
#include "trainyard/error.h"
#include "trainyard/log.h"
#include "trainyard/metrics/node_sampler.h"
#include "trainyard/net/base_url.h"
#include "trainyard/remove_tree.h"

namespace trainyard::cluster {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr std::size_t kMaxLinesPerPost = wire::kMaxLogLinesPerBatch;
// Text per batch: escaped as JSON (control characters as \u00XX, six bytes each) it stays under
// the head's 8 MiB body limit (HttpServerOptions::max_body_bytes), even for one 1 MiB line.
constexpr std::size_t kMaxBytesPerPost = 1 << 20;
constexpr milliseconds kShipInterval{250};  // how often spooled lines are sent
// How long one turn of the loop ships batches back to back before it polls the jobs and beats.
constexpr milliseconds kShipTurn{1'000};
constexpr milliseconds kWarnEvery{10'000};  // a failing head is logged at most this often
constexpr const char* kAssignmentFile = "assignment.json";
constexpr const char* kReportFile = "report.json";
constexpr const char* kOutputFile = "output.log";
constexpr const char* kShippedFile = "shipped";
constexpr const char* kMetricsDir = "metrics";  // state_dir/jobs/<id>/metrics: the rank files

// Writes `text` to `path` through a temporary name and a rename, so a crash leaves the old or the
// new contents. The file is private to the worker's user (0600).
void write_file_atomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  make_private_file(tmp);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    TY_CHECK_T(Error, out.good(), "Could not write ", tmp.string(), ". HINT: check that the ",
               "worker's --state-dir is writable and not full.");
  }
  fs::rename(tmp, path);
}

std::optional<std::string> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A whole decimal number (surrounding whitespace allowed), or nullopt.
std::optional<std::int64_t> parse_int(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())))
    text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
    text.remove_suffix(1);
  std::int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

// JSON text of `j`, with bytes that are not UTF-8 (a rank may print anything) replaced by U+FFFD
// instead of failing.
std::string lossy_dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string random_hex(int chars) {
  std::random_device device;
  std::mt19937_64 gen((static_cast<std::uint64_t>(device()) << 32) ^ device());
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < chars; ++i) out += kHex[gen() % 16];
  return out;
}

// d scaled by a random factor in [1 - jitter, 1 + jitter].
milliseconds jittered(milliseconds d, double jitter = 0.2) {
  thread_local std::mt19937 gen(std::random_device{}());
  std::uniform_real_distribution<double> f(1.0 - jitter, 1.0 + jitter);
  return milliseconds(static_cast<std::int64_t>(static_cast<double>(d.count()) * f(gen)));
}

// The lines of one job on this node, numbered, spooled on disk until the head has them.
// Thread-safe: append() runs on the agent's output thread, the rest on the daemon's.
class LogSpool {
 public:
  struct Line {
    std::int64_t seq;
    int rank;
    std::string text;
  };

  explicit LogSpool(fs::path dir) : dir_(std::move(dir)) {
    // What a crash can leave: a `shipped` file that is empty or cut (then every spooled line goes
    // again; the head stores each number once), and a last row without its newline (cut off
    // here, so that the next row starts on a line of its own).
    if (auto shipped = read_file(dir_ / kShippedFile)) shipped_ = parse_int(*shipped).value_or(0);
    const fs::path output = dir_ / kOutputFile;
    std::string text = read_file(output).value_or("");
    if (!text.empty() && text.back() != '\n') {
      text.resize(text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1);
      std::error_code ec;
      fs::resize_file(output, text.size(), ec);
    }
    // Rows from an earlier run of the worker: "<seq>\t<rank>\t<text>".
    std::size_t start = 0;
    while (start < text.size()) {
      const std::size_t end = text.find('\n', start);
      const std::string_view row(text.data() + start, end - start);
      start = end + 1;
      const std::size_t a = row.find('\t');
      const std::size_t b = a == std::string_view::npos ? a : row.find('\t', a + 1);
      if (b == std::string_view::npos) continue;
      const auto seq = parse_int(row.substr(0, a));
      const auto rank = parse_int(row.substr(a + 1, b - a - 1));
      if (!seq || !rank) continue;
      next_ = std::max(next_, *seq + 1);
      if (*seq >= shipped_) {
        pending_.push_back({*seq, static_cast<int>(*rank), std::string(row.substr(b + 1))});
      }
    }
    next_ = std::max(next_, shipped_);
    make_private_file(output);  // the job's output may hold secrets
    file_ = std::fopen(output.c_str(), "a");
    TY_CHECK_T(Error, file_ != nullptr, "Could not open ", output.string(),
               " for appending. HINT: check the worker's --state-dir.");
  }
  ~LogSpool() {
    if (file_ != nullptr) std::fclose(file_);
  }

  void append(int rank, const std::string& text) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::int64_t seq = next_++;
    // A kill -9 of the worker keeps what fflush handed the kernel; only a crash of the machine
    // can lose the newest lines, and the ranks died with it.
    std::fprintf(file_, "%lld\t%d\t%s\n", static_cast<long long>(seq), rank, text.c_str());
    std::fflush(file_);
    pending_.push_back({seq, rank, text});
  }

  // Up to `max` lines from the oldest not yet shipped.
  std::vector<Line> take(std::size_t max) const {
    std::lock_guard<std::mutex> lock(mu_);
    const std::size_t n = std::min(max, pending_.size());
    return {pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(n)};
  }

  // The head has stored every line before `next`.
  void shipped(std::int64_t next) {
    std::lock_guard<std::mutex> lock(mu_);
    while (!pending_.empty() && pending_.front().seq < next) pending_.pop_front();
    shipped_ = std::max(shipped_, next);
    write_file_atomically(dir_ / kShippedFile, std::to_string(shipped_));
  }

  bool empty() const {
    std::lock_guard<std::mutex> lock(mu_);
    return pending_.empty();
  }

  // The number after the last line appended: how many lines the job printed here.
  std::int64_t end() const {
    std::lock_guard<std::mutex> lock(mu_);
    return next_;
  }

 private:
  fs::path dir_;
  mutable std::mutex mu_;
  std::FILE* file_ = nullptr;  // guarded by mu_
  std::int64_t next_ = 0;
  std::int64_t shipped_ = 0;
  std::deque<Line> pending_;
};

// One job placed on this node.
struct Job {
  std::string id;
  wire::Instance instance = 0;  // Note [Job instances on the wire] (head_state.cpp)
  fs::path dir;
  std::unique_ptr<LogSpool> spool;
  // Its ranks' metrics folder (state_dir/jobs/<id>/metrics) and processes; see Note [Metrics in
  // heartbeats]. Declared before the agent, whose events it follows, so that it outlives it.
  std::unique_ptr<elastic::AgentMetrics> metrics;
  std::unique_ptr<elastic::Agent> agent;  // null once finished (or when it never started)

  mutable std::mutex mu;
  wire::JobReport report;  // guarded by mu: the running report (ranks, restarts)
  // guarded by mu: the report written when the agent ended. It goes out only once every line the
  // ranks printed is stored on the head, so that a job that ended there has its whole log.
  std::optional<wire::JobReport> final_report;
  bool final_acknowledged = false;  // a registration or heartbeat carrying it was answered
  bool stop_requested = false;
};

}  // namespace

struct Worker::Impl {
  explicit Impl(WorkerOptions o) : options(std::move(o)) {}

  WorkerOptions options;
  std::unique_ptr<StateDir> state_dir;  // held for the worker's life once started
  std::string base;                     // the head's base URL
  std::string node_id;
  NodeResources resources;
  std::string address;  // advertised

  std::thread thread;
  std::mutex mu;
  std::condition_variable wake;
  bool stopping = false;  // guarded by mu
  bool started = false;   // guarded by mu
  std::string leave_reason = "exited";
  std::atomic<bool> registered{false};
  std::atomic<int> running{0};
  milliseconds heartbeat_interval{2'000};

  std::map<std::string, std::unique_ptr<Job>> jobs;  // daemon thread only
  std::unique_ptr<HeadClient> client;                // daemon thread only
  UsageSampler usage;
  std::unique_ptr<metrics::NodeSampler> sampler;  // daemon thread only; null when it failed
  Clock::time_point last_warning{};

  std::shared_ptr<spdlog::logger> log = logger("worker");

  void start();
  void run();
  bool wait_for(milliseconds d);  // false when stopping
  bool is_stopping() {
    std::lock_guard<std::mutex> lock(mu);
    return stopping;
  }
  void warn_rate_limited(const std::string& what);

  // Every job's report: the final one where it is due (its lines all shipped), else the running
  // one. `finals` gets the jobs whose final report is in it.
  std::vector<wire::JobReport> job_reports(std::vector<Job*>& finals);
  void acknowledge(const std::vector<Job*>& finals);
  wire::Registration registration(std::vector<Job*>& finals);
  wire::Heartbeat heartbeat_body(std::vector<Job*>& finals);
  // The heartbeat's metrics field; see Note [Metrics in heartbeats].
  json metrics_json();
  void loop_once(milliseconds& backoff, int& attempts, Clock::time_point& next_heartbeat);
  void handle_answer(const wire::HeartbeatAnswer& answer);
  void start_job(const wire::Assignment& assignment);
  void recover_jobs();
  void poll_jobs();
  // Ships spooled lines, a batch of each job's in turn, until every spool is empty or `deadline`.
  void ship_logs(Clock::time_point deadline);
  void finish_job(Job& job, const elastic::LaunchResult& result);
  void drain(const std::string& reason);
};

void Worker::Impl::start() {
  TY_CHECK_T(InvalidArgumentError, !options.state_dir.empty(),
             "WorkerOptions.state_dir is empty. HINT: pass --state-dir, a folder of its own for "
             "each worker on a machine.");
  base = net::base_url(options.head, kDefaultHeadPort, "--head");
  state_dir = std::make_unique<StateDir>(options.state_dir, "trainyard worker");
  std::error_code ec;
  fs::create_directories(fs::path(options.state_dir) / "jobs", ec);
  TY_CHECK_T(Error, !ec, "Could not create the worker's state directory ", options.state_dir, ": ",
             ec.message(), ". HINT: pass a writable --state-dir.");
  const fs::path id_file = fs::path(options.state_dir) / "node_id";
  if (auto id = read_file(id_file); id && !id->empty()) {
    node_id = *id;
    while (!node_id.empty() && std::isspace(static_cast<unsigned char>(node_id.back())))
      node_id.pop_back();
  } else {
    node_id = random_hex(32);
    write_file_atomically(id_file, node_id + "\n");
  }
  resources = detect_resources(options.resources);
  heartbeat_interval = options.heartbeat_interval;
  client = std::make_unique<HeadClient>(HeadClientOptions{
      .address = base, .token = options.token, .timeout = milliseconds(10'000), .max_attempts = 1});
  try {
    sampler = std::make_unique<metrics::NodeSampler>(options.node_sampler);
  } catch (const std::exception& e) {
    log->warn("The node's metrics are left out of heartbeats: {}", e.what());
  }
  recover_jobs();
  thread = std::thread([this] { run(); });
}

bool Worker::Impl::wait_for(milliseconds d) {
  std::unique_lock<std::mutex> lock(mu);
  return !wake.wait_for(lock, d, [&] { return stopping; });
}

void Worker::Impl::warn_rate_limited(const std::string& what) {
  const auto now = Clock::now();
  if (now - last_warning < kWarnEvery) return;
  last_warning = now;
  log->warn("{}", what);
}

std::vector<wire::JobReport> Worker::Impl::job_reports(std::vector<Job*>& finals) {
  std::vector<wire::JobReport> out;
  for (auto& [id, job] : jobs) {
    std::lock_guard<std::mutex> lock(job->mu);
    if (job->final_report) {  // its lines may follow: Note [A job ends before its logs]
      out.push_back(*job->final_report);
      finals.push_back(job.get());
    } else {
      out.push_back(job->report);
    }
  }
  return out;
}

void Worker::Impl::acknowledge(const std::vector<Job*>& finals) {
  for (Job* job : finals) {
    std::lock_guard<std::mutex> lock(job->mu);
    job->final_acknowledged = true;
  }
}

wire::Registration Worker::Impl::registration(std::vector<Job*>& finals) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return {.node_id = node_id,
          .hostname = host,
          .address = address,
          .resources = resources,
          .jobs = job_reports(finals)};
}

wire::Heartbeat Worker::Impl::heartbeat_body(std::vector<Job*>& finals) {
  const UsageSample u = usage.sample();
  return {.usage = {.cpu_used = u.cpu_used,
                    .cpu_fraction = u.cpu_fraction,
                    .memory_used_bytes = u.memory_used_bytes},
          .jobs = job_reports(finals),
          .metrics = metrics_json()};
}

// Note [Metrics in heartbeats]
// Every heartbeat carries the node's metrics (api::field::kMetrics, a metrics::Snapshot): the
// NodeSampler's node families, unlabelled (the head adds the node label), the CPU and memory of
// each running job's rank processes, and each running job's rank files (what the ranks' own
// registries publish to $TRAINYARD_METRICS_DIR = state_dir/jobs/<id>/metrics), all labelled
// {job_id, rank}. The rank files are cleared when a round starts, so the ranks of an earlier,
// larger world do not linger; a job that ended is no longer reported. Building it reads a few small
// files in /proc and one file per rank: about a millisecond for a node of 8 ranks
// (docs/BENCHMARKS.md), logged at debug level each time and warned about when it takes longer
// than a quarter of the heartbeat interval.
json Worker::Impl::metrics_json() {
  const auto start = Clock::now();
  std::vector<metrics::WatchedProcess> watched;
  std::vector<const elastic::AgentMetrics*> running_jobs;
  for (auto& [id, job] : jobs) {
    if (!job->agent || !job->metrics) continue;
    {
      std::lock_guard<std::mutex> lock(job->mu);
      if (job->final_report) continue;
    }
    auto processes = job->metrics->processes();
    watched.insert(watched.end(), processes.begin(), processes.end());
    running_jobs.push_back(job->metrics.get());
  }
  metrics::Snapshot snapshot;
  if (sampler) {
    try {
      snapshot = sampler->sample(watched);
    } catch (const std::exception& e) {
      warn_rate_limited(detail::concat(
          "Could not sample this node's metrics (heartbeats go without): ", e.what()));
    }
  }
  for (const elastic::AgentMetrics* job : running_jobs)
    metrics::merge_into(snapshot, job->rank_snapshot());
  json out;
  metrics::to_json(out, snapshot);
  const auto took = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  log->debug("The heartbeat's metrics ({} families, {} job(s)) took {:.2f} ms to build.",
             snapshot.size(), running_jobs.size(), took);
  if (took > 0.25 * static_cast<double>(heartbeat_interval.count())) {
    warn_rate_limited(detail::concat("Building the heartbeat's metrics took ", took,
                                     " ms, more than a quarter of the heartbeat interval (",
                                     heartbeat_interval.count(), " ms)."));
  }
  return out;
}

void Worker::Impl::run() {
  milliseconds backoff = options.connect_backoff;
  int attempts = 0;
  auto next_heartbeat = Clock::now();
  while (!is_stopping()) {
    try {
      loop_once(backoff, attempts, next_heartbeat);
    } catch (const std::exception& e) {
      // Not an answer from the head (those are handled inside): a full disk, a malformed answer.
      // The daemon and its jobs stay up; the next round tries again.
      log->error("The worker's loop failed (it goes on): {}", e.what());
      if (!wait_for(options.connect_backoff)) break;
    }
  }
  drain(leave_reason);
}

void Worker::Impl::loop_once(milliseconds& backoff,
                             int& attempts,
                             Clock::time_point& next_heartbeat) {
  if (!registered) {
    try {
      // The route to the head is asked again on every attempt: the head may come back at
      // another address behind the same name.
      address = !options.address.empty()
                    ? options.address
                    : route_address(
                          net::url_host(base), net::url_port(base),
                          {.what = "the head", .host_flag = "--head", .local_flag = "--address"});
      std::vector<Job*> finals;
      const auto answer =
          client->post(api::kNodesPath, registration(finals), true).get<wire::RegistrationAnswer>();
      acknowledge(finals);
      heartbeat_interval = milliseconds(answer.heartbeat_interval_ms);
      registered = true;
      log->info(
          "Registered with the head at {} as node {} ({} CPU, {} GPU, {} bytes of memory; "
          "reachable at {}).",
          base, node_id, resources.cpu, resources.gpu, resources.memory_bytes, address);
      backoff = options.connect_backoff;
      attempts = 0;
      next_heartbeat = Clock::now();
    } catch (const InvalidArgumentError& e) {
      warn_rate_limited(
          detail::concat("The head at ", base, " refused this node's registration: ", e.what()));
    } catch (const Error& e) {
      ++attempts;
      warn_rate_limited(detail::concat("Waiting for the head at ", base, " (attempt ", attempts,
                                       "): ", e.what()));
    }
    if (!registered) {
      wait_for(jittered(backoff));
      backoff = std::min(backoff * 2, options.connect_backoff_max);
      return;
    }
  }
  poll_jobs();
  // Lines before the heartbeat, for a turn at most: an ended job's report does not wait for them
  // (Note [A job ends before its logs] in head_state.cpp).
  ship_logs(Clock::now() + kShipTurn);
  if (Clock::now() >= next_heartbeat) {
    try {
      std::vector<Job*> finals;
      const auto answer =
          client->post(api::node_heartbeat_path(node_id), heartbeat_body(finals), true)
              .get<wire::HeartbeatAnswer>();
      // A head that does not know this node (restarted) applied nothing: the registration that
      // follows carries the final reports again.
      if (answer.registered) acknowledge(finals);
      handle_answer(answer);
    } catch (const Error& e) {
      warn_rate_limited(detail::concat("A heartbeat to the head at ", base,
                                       " failed (the jobs here keep running): ", e.what()));
    }
    next_heartbeat = Clock::now() + heartbeat_interval;
  }
  // Jobs whose final report the head has (and so every line) leave the worker.
  for (auto it = jobs.begin(); it != jobs.end();) {
    Job& job = *it->second;
    bool done = false;
    {
      std::lock_guard<std::mutex> lock(job.mu);
      done = job.final_report && job.final_acknowledged && job.spool->empty();
    }
    if (done) {
      std::error_code ec;
      remove_tree(job.dir.string(), ec);
      it = jobs.erase(it);
    } else {
      ++it;
    }
  }
  wait_for(std::min(kShipInterval, heartbeat_interval));
}

void Worker::Impl::handle_answer(const wire::HeartbeatAnswer& answer) {
  if (!answer.registered) {
    log->warn(
        "The head at {} does not know node {} (it restarted, or took this node for dead); "
        "registering again.",
        base, node_id);
    registered = false;
    return;
  }
  for (const wire::Assignment& a : answer.assignments) {
    if (jobs.count(a.job_id) == 0) start_job(a);
  }
  for (const std::string& id : answer.stop) {
    auto it = jobs.find(id);
    if (it == jobs.end()) continue;
    Job& job = *it->second;
    std::lock_guard<std::mutex> lock(job.mu);
    if (!job.stop_requested && job.agent) {
      log->info("The head asked to stop job {}.", job.id);
      job.stop_requested = true;
      job.agent->stop(SIGTERM);
    }
  }
}

void Worker::Impl::start_job(const wire::Assignment& a) {
  auto job = std::make_unique<Job>();
  job->id = a.job_id;
  job->instance = a.instance;
  // The id names a folder under state_dir/jobs: nothing that could step out of it.
  TY_CHECK_T(InvalidArgumentError,
             !job->id.empty() && job->id.front() != '.' &&
                 job->id.find_first_of("/\\") == std::string::npos,
             "The head assigned a job with the id '", job->id,
             "', which cannot name a folder; the job is not run here.");
  job->dir = fs::path(options.state_dir) / "jobs" / job->id;
  fs::create_directories(job->dir);
  write_file_atomically(job->dir / kAssignmentFile, json(a).dump());
  job->spool = std::make_unique<LogSpool>(job->dir);
  job->metrics =
      std::make_unique<elastic::AgentMetrics>(job->id, (job->dir / kMetricsDir).string());
  job->report = {
      .job_id = job->id, .instance = job->instance, .state = wire::ReportState::kRunning};
  Job* raw = job.get();
  try {
    const int nproc = a.launch.nproc_per_node;
    elastic::RendezvousOptions r;
    r.run_id = job->id;
    r.min_nodes = a.min_nodes;
    r.max_nodes = a.max_nodes;
    r.node_id = node_id + "-" + random_hex(6);
    r.local_addr = address;
    r.local_world_size = nproc;
    r.backend_timeout = options.head_outage_timeout;
    // The nodes of a job notice a lost one within three heartbeat intervals, as the head does.
    r.keep_alive_interval = heartbeat_interval;
    auto backend =
        elastic::make_head_backend({.head = base, .run_id = job->id, .token = options.token});
    elastic::LaunchOptions o;
    o.command = {"/bin/sh", "-c", a.entrypoint};
    o.nproc_per_node = nproc;
    o.run_id = job->id;
    o.max_restarts = a.launch.max_restarts;
    if (a.launch.restart_backoff) o.restart_backoff = *a.launch.restart_backoff;
    if (a.launch.restart_backoff_max) o.restart_backoff_max = *a.launch.restart_backoff_max;
    if (a.launch.hang_timeout) o.hang_timeout = *a.launch.hang_timeout;
    // As `trainyard run` takes them: the longest back-off is at least the first.
    o.restart_backoff_max = std::max(o.restart_backoff_max, o.restart_backoff);
    o.term_timeout = options.stop_timeout;
    o.rendezvous = std::make_shared<elastic::Rendezvous>(std::move(backend), r);
    for (const auto& [k, v] : a.env) o.extra_env.emplace_back(k, v);
    o.extra_env.emplace_back(kJobIdEnv, job->id);
    o.extra_env.push_back(job->metrics->env());
    // `trainyard ...` in an entrypoint is this very binary, as `ray` is in a Ray job's.
    const char* path = std::getenv("PATH");
    o.extra_env.insert(o.extra_env.begin(),
                       {"PATH", fs::path(elastic::self_executable()).parent_path().string() +
                                    (path != nullptr ? std::string(":") + path : std::string())});
    o.forward_output = options.forward_output;
    o.on_output = [raw](const elastic::OutputLine& line) {
      raw->spool->append(line.rank, std::string(line.text));
    };
    o.on_event = [raw](const elastic::AgentEvent& e) {
      using Kind = elastic::AgentEventKind;
      raw->metrics->on_event(e);  // before the round's ranks start, old rank files go
      if (e.kind == Kind::kRoundStarted) {
        std::lock_guard<std::mutex> lock(raw->mu);
        raw->report.ranks.clear();
        for (int i = 0; i < e.local_world_size; ++i) raw->report.ranks.push_back(e.rank_offset + i);
        raw->report.restart_count = e.restart_count;
        raw->report.world_size = e.world_size;
      }
    };
    job->agent = std::make_unique<elastic::Agent>(std::move(o));
    job->agent->start();
    running++;
    log->info("Started job {} ({} rank(s) here): {}", job->id, nproc, a.entrypoint);
  } catch (const std::exception& e) {
    log->error("Could not start job {}: {}", job->id, e.what());
    job->agent.reset();
    std::lock_guard<std::mutex> lock(job->mu);
    job->final_report = wire::JobReport{
        .job_id = job->id,
        .instance = job->instance,
        .state = wire::ReportState::kFailed,
        .error_type = std::string(wire::kCommandStartError),
        .message = detail::concat("Node ", node_id, " could not start the job: ", e.what())};
    write_file_atomically(job->dir / kReportFile, lossy_dump(*job->final_report));
  }
  jobs.emplace(raw->id, std::move(job));
}

void Worker::Impl::poll_jobs() {
  for (auto& [id, job] : jobs) {
    if (!job->agent || job->agent->running()) continue;
    elastic::LaunchResult result;
    try {
      result = job->agent->wait();
    } catch (const std::exception& e) {
      result.succeeded = false;
      result.summary = e.what();
    }
    finish_job(*job, result);
  }
}

void Worker::Impl::finish_job(Job& job, const elastic::LaunchResult& result) {
  job.agent.reset();
  running--;
  std::lock_guard<std::mutex> lock(job.mu);
  wire::JobReport r = job.report;
  r.restart_count = result.restart_count;
  if (result.succeeded) {
    r.state = wire::ReportState::kSucceeded;
    r.exit_code = 0;
  } else if (job.stop_requested || (result.received_signal != 0 && result.first_failure < 0)) {
    r.state = wire::ReportState::kStopped;
    r.message = "Stopped on request.";
  } else {
    r.state = wire::ReportState::kFailed;
    r.exit_code = result.exit_code();
    r.error_type = wire::kCommandError;
    r.message = result.summary.empty() ? std::string("The job's ranks failed.") : result.summary;
    if (result.first_failure >= 0) {
      const auto& e = result.exits[static_cast<std::size_t>(result.first_failure)];
      r.failed_rank = e.rank;
      r.last_lines = e.last_lines;
    }
  }
  r.line_count = job.spool->end();  // the agent has ended: every line is spooled
  write_file_atomically(job.dir / kReportFile, lossy_dump(r));
  log->info("Job {} ended here: {}.", job.id, wire::to_string(r.state));
  job.final_report = std::move(r);
}

void Worker::Impl::recover_jobs() {
  const fs::path root = fs::path(options.state_dir) / "jobs";
  for (const auto& entry : fs::directory_iterator(root)) {
    if (!entry.is_directory()) continue;
    const auto assignment = read_file(entry.path() / kAssignmentFile);
    if (!assignment) continue;
    auto job = std::make_unique<Job>();
    job->id = entry.path().filename();
    job->dir = entry.path();
    job->spool = std::make_unique<LogSpool>(job->dir);
    try {
      job->instance =
          wire::parse_message(*assignment, "assignment").get<wire::Assignment>().instance;
    } catch (const std::exception& e) {
      log->warn("Job {}'s assignment {} is unreadable ({}).", job->id,
                (entry.path() / kAssignmentFile).string(), e.what());
    }
    std::optional<wire::JobReport> report;
    if (auto text = read_file(entry.path() / kReportFile)) {
      try {
        report = wire::parse_message(*text, "job report").get<wire::JobReport>();
      } catch (const std::exception& e) {
        log->warn("Job {}'s report {} is unreadable ({}); it is reported as lost.", job->id,
                  (entry.path() / kReportFile).string(), e.what());
      }
    }
    if (!report) {
      report = wire::JobReport{
          .job_id = job->id,
          .instance = job->instance,
          .state = wire::ReportState::kFailed,
          .error_type = std::string(wire::kNodeRestarted),
          .message = detail::concat("The worker on node ", node_id,
                                    " restarted while the job ran; its ranks on this node were "
                                    "stopped with it.")};
      write_file_atomically(job->dir / kReportFile, lossy_dump(*report));
    }
    log->info("Recovered job {} from {} ({}).", job->id, job->dir.string(),
              wire::to_string(report->state));
    job->report = *report;
    job->final_report = std::move(report);
    jobs.emplace(job->id, std::move(job));
  }
}

void Worker::Impl::ship_logs(Clock::time_point deadline) {
  // Batches back to back, one job's after another's, until every spool is empty or the deadline.
  std::set<std::string> idle;  // jobs with nothing (more) to send now, or whose head failed
  while (idle.size() < jobs.size() && Clock::now() < deadline) {
    for (auto& [id, job] : jobs) {
      if (idle.count(id) || Clock::now() >= deadline) continue;
      auto lines = job->spool->take(kMaxLinesPerPost);
      // Batches stay far below the head's body limit however long the lines are.
      std::size_t bytes = 0, n = 0;
      while (n < lines.size() && (n == 0 || bytes + lines[n].text.size() <= kMaxBytesPerPost)) {
        bytes += lines[n++].text.size();
      }
      lines.resize(n);
      if (lines.empty()) {
        idle.insert(id);
        continue;
      }
      wire::LogBatch batch{
          .node_id = node_id, .instance = job->instance, .first_seq = lines.front().seq};
      batch.lines.reserve(lines.size());
      for (auto& l : lines) batch.lines.push_back({.rank = l.rank, .text = std::move(l.text)});
      try {
        const auto answer =
            client->post(api::worker_logs_path(id), batch, true).get<wire::LogBatchAnswer>();
        job->spool->shipped(answer.next_seq);
      } catch (const NotFoundError&) {
        // The job was deleted on the head: its lines have nowhere to go.
        job->spool->shipped(lines.back().seq + 1);
      } catch (const Error& e) {
        warn_rate_limited(detail::concat("Could not ship job ", id, "'s logs to the head at ", base,
                                         " (they stay spooled): ", e.what()));
        idle.insert(id);  // the next job's lines may still go
      }
    }
  }
}

void Worker::Impl::drain(const std::string& reason) {
  // Stop every job's ranks and wait for them: SIGTERM, SIGKILL after the agents' term_timeout
  // (stop_timeout). A job the head already asked to stop is not signalled twice (a second stop
  // kills at once, cutting short a save on SIGTERM).
  for (auto& [id, job] : jobs) {
    if (!job->agent) continue;
    std::lock_guard<std::mutex> lock(job->mu);
    if (job->stop_requested) continue;
    job->stop_requested = true;
    job->agent->stop(SIGTERM);
  }
  for (auto& [id, job] : jobs) {
    if (!job->agent) continue;
    elastic::LaunchResult result;
    try {
      result = job->agent->wait();
    } catch (const std::exception& e) {
      result.summary = e.what();
    }
    finish_job(*job, result);
  }
  if (!registered) return;
  // Hand over what is left within stop_timeout: logs, final reports, then leave. What does not
  // go stays spooled for the next start of this worker.
  try {
    ship_logs(Clock::now() + options.stop_timeout);
    std::vector<Job*> finals;
    client->post(api::node_heartbeat_path(node_id), heartbeat_body(finals), true);
    client->post(api::node_leave_path(node_id), wire::LeaveRequest{.reason = reason}, true);
    log->info("Left the cluster ({}).", reason);
  } catch (const Error& e) {
    log->warn("Could not tell the head at {} that node {} leaves: {}", base, node_id, e.what());
  }
}

Worker::Worker(WorkerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

Worker::~Worker() {
  try {
    stop("exited");
  } catch (...) {
  }
}

void Worker::start() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    TY_CHECK(!impl_->started, "Worker::start() was called twice.");
    impl_->started = true;
  }
  impl_->start();
}

void Worker::stop(const std::string& reason) {
  std::thread thread;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
    impl_->leave_reason = reason;
    thread = std::move(impl_->thread);  // exactly one caller joins it
  }
  impl_->wake.notify_all();
  if (thread.joinable()) thread.join();
}

const std::string& Worker::node_id() const {
  return impl_->node_id;
}
bool Worker::registered() const {
  return impl_->registered;
}
int Worker::running_jobs() const {
  return impl_->running;
}

}  // namespace trainyard::cluster
