#include "tools/cluster_commands.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tools/launch_flags.h"
#include "trainyard/cluster/api.h"
#include "trainyard/cluster/head_client.h"
#include "trainyard/cluster/job_spec.h"
#include "trainyard/cluster/status_report.h"
#include "trainyard/cluster/wire.h"
#include "trainyard/elastic/subprocess.h"
#include "trainyard/error.h"
#include "trainyard/terminal_text.h"

namespace trainyard::cli {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr milliseconds kPollInterval{500};

// How long a client command rides out a head it cannot reach (Note [Clients ride out a head
// restart]): a restart takes seconds; a head that is gone for good is reported within a minute.
constexpr milliseconds kDefaultHeadTimeout{60'000};

// The flags every client command has.
struct ClientFlags {
  std::string address;
  std::string token_file;
  milliseconds head_timeout = kDefaultHeadTimeout;
};

void add_client_flags(CLI::App& c, ClientFlags& f) {
  c.add_option("--address", f.address,
               "The head: http://HOST:PORT or HOST:PORT (default: $TRAINYARD_ADDRESS, else "
               "http://127.0.0.1:8265)");
  c.add_option("--token-file", f.token_file,
               "A file holding the cluster token, readable only by its owner (default: "
               "$TRAINYARD_TOKEN)");
  add_seconds_option(c, f.head_timeout,
                     {.names = "--head-timeout",
                      .description = "Seconds each call keeps retrying, with back-off, while the "
                                     "head cannot be reached or answers 5xx (a restart); 0: three "
                                     "quick attempts",
                      .max = 86400,
                      .hint = "e.g. 60; 0 gives up after three quick attempts."});
}

cluster::HeadClient make_client(const ClientFlags& f) {
  return cluster::HeadClient({.address = cluster::resolve_address(f.address),
                              .token = cluster::resolve_token(f.token_file),
                              .ride_out = f.head_timeout});
}

// Note [A submission that landed]
// A submission whose answer was lost (the head restarted after taking it) is retried, and must
// not become a second job or a failure: so the client names the job itself when the user gives
// no --submission-id (the head would make up the same kind of id), which makes the POST
// idempotent. A 409 for that id at a later attempt is then the earlier attempt's job, which the
// client checks by its entrypoint before following it; at the first attempt, or for another
// entrypoint, it is someone else's id, and the head's refusal stands.
std::string submit_job(cluster::HeadClient& client, cluster::wire::JobSubmission submission) {
  if (!submission.submission_id) submission.submission_id = cluster::make_submission_id();
  try {
    return client.post(cluster::api::kJobsPath, submission, /*idempotent=*/true)
        .get<cluster::wire::SubmitAnswer>()
        .submission_id;
  } catch (const cluster::ConflictError& e) {
    if (e.attempt() == 1) throw;
    const auto job = client.get(cluster::api::job_path(*submission.submission_id))
                         .get<cluster::wire::JobDetails>();
    if (job.entrypoint != submission.entrypoint) throw;
    return job.submission_id;
  }
}

// "KEY=VALUE" split at the first '='; the flag is named in the error.
std::pair<std::string, std::string> key_value(const std::string& text, const char* flag) {
  const std::size_t eq = text.find('=');
  TY_CHECK_T(InvalidArgumentError, eq != std::string::npos && eq > 0, flag, " '", text,
             "' is not KEY=VALUE.");
  return {text.substr(0, eq), text.substr(eq + 1)};
}

// Writes a job's output to stdout: on a terminal with its control characters escaped, so that a
// job cannot drive the user's terminal (clear it, retitle it, rewrite lines); to a pipe or file
// as it is.
std::string shown(std::string_view text) {
  static const bool terminal = ::isatty(STDOUT_FILENO) == 1;
  return terminal ? escape_for_terminal(text) : std::string(text);
}

void write_output(std::string_view text) {
  const std::string out = shown(text);
  std::fwrite(out.data(), 1, out.size(), stdout);
}

// Prints the job's log lines after line `after` (all of them for 0) and returns the number of the
// last line printed; pages through GET /logs?after=N. Lines of other ranks are left out when
// rank >= 0 (lines carry a "[node:rank] " prefix).
std::int64_t print_new_logs(cluster::HeadClient& client,
                            const std::string& id,
                            std::int64_t after,
                            int rank) {
  const std::string tag = ":" + std::to_string(rank) + "] ";
  for (;;) {
    const auto page =
        client.get(cluster::api::job_logs_path(id) + "?after=" + std::to_string(after))
            .get<cluster::wire::LogPage>();
    const std::string& logs = page.logs;
    const std::int64_t next = page.next.value_or(after);
    if (rank < 0) {
      write_output(logs);
    } else {
      std::size_t start = 0;
      while (start < logs.size()) {
        std::size_t end = logs.find('\n', start);
        end = end == std::string::npos ? logs.size() : end + 1;
        const std::string_view line(logs.data() + start, end - start);
        const std::size_t close = line.find("] ");
        if (close != std::string_view::npos && close + 2 >= tag.size() &&
            line.substr(close + 2 - tag.size(), tag.size()) == tag) {
          write_output(line);
        }
        start = end;
      }
    }
    std::fflush(stdout);
    if (next == after) return after;  // nothing more for now
    after = next;
  }
}

// Follows a job's logs until it has ended and the head holds all of them (Note [A job ends
// before its logs] in head_state.cpp); returns its final details.
cluster::wire::JobDetails follow(cluster::HeadClient& client, const std::string& id, int rank) {
  std::int64_t printed = 0;
  for (;;) {
    const auto job = client.get(cluster::api::job_path(id)).get<cluster::wire::JobDetails>();
    printed = print_new_logs(client, id, printed, rank);
    if (cluster::api::is_terminal_status(job.status) && job.logs_complete) {
      // Lines that arrived with the final report.
      print_new_logs(client, id, printed, rank);
      return job;
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

// "2026-11-28 12:00:01" of a time in milliseconds since the epoch, local time; "-" for none.
std::string clock_time(std::optional<std::int64_t> ms) {
  if (!ms) return "-";
  const std::time_t t = static_cast<std::time_t>(*ms / 1000);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

void print_final(const cluster::wire::JobDetails& job) {
  const char* id = job.job_id.c_str();
  std::printf("------------------------------------------\n");
  if (job.status == cluster::api::kSucceeded) {
    std::printf("Job '%s' succeeded\n", id);
  } else if (job.status == cluster::api::kStopped) {
    std::printf("Job '%s' was stopped\n", id);
  } else {
    std::printf("Job '%s' failed\n", id);
    if (!job.message.empty()) std::printf("Status message: %s\n", shown(job.message).c_str());
  }
  std::printf("------------------------------------------\n");
}

void add_status(CLI::App& app, int& exit_code) {
  auto* c = app.add_subcommand("status", "The cluster's nodes and resources, like `ray status`");
  auto f = std::make_shared<ClientFlags>();
  auto verbose = std::make_shared<bool>(false);
  auto as_json = std::make_shared<bool>(false);
  add_client_flags(*c, *f);
  c->add_flag("-v,--verbose", *verbose, "Add each node's address, resources, heartbeat and ranks");
  c->add_flag("--json", *as_json, "Print the head's snapshot as JSON");
  c->callback([f, verbose, as_json, &exit_code] {
    auto client = make_client(*f);
    const json snapshot = client.get(cluster::api::kStatusPath);
    const std::string text = *as_json
                                 ? snapshot.dump(2) + "\n"
                                 : cluster::format_status(snapshot.get<cluster::ClusterSnapshot>(),
                                                          {.verbose = *verbose});
    std::fwrite(text.data(), 1, text.size(), stdout);
    exit_code = 0;
  });
}

void add_submit(CLI::App& app, int& exit_code) {
  struct Flags {
    ClientFlags client;
    std::string nodes = "1";
    int nproc_per_node = 1;
    elastic::LaunchOptions restarts;  // --max-restarts, --restart-backoff[-max], --hang-timeout
    std::string submission_id;
    double num_cpus = 0;
    double num_gpus = 0;
    std::vector<std::string> env;
    std::vector<std::string> metadata;
    bool no_wait = false;
    std::vector<std::string> command;
  };
  auto f = std::make_shared<Flags>();
  auto* c = app.add_subcommand(
      "submit",
      "Run a command on the cluster's nodes under the elastic agent, like `ray job submit`");
  add_client_flags(*c, f->client);
  c->add_option("--nodes", f->nodes, "Nodes: N, or MIN:MAX for an elastic job")
      ->capture_default_str();
  c->add_option("--nproc-per-node,--nproc_per_node", f->nproc_per_node, "Ranks on each node")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  // As `trainyard run` declares them: each node's agent restarts and watches the ranks so.
  add_restart_flags(*c, f->restarts);
  c->add_option("--submission-id", f->submission_id, "The job's id (default: one is made up)");
  c->add_option("--num-cpus", f->num_cpus, "CPUs each rank needs (default 1)")
      ->check(CLI::Range(0.0, 4096.0));
  c->add_option("--num-gpus", f->num_gpus, "GPUs each rank needs (default 0)")
      ->check(CLI::Range(0.0, 64.0));
  // One KEY=VALUE per flag: a flag taking several would also take the `--` that starts the
  // command, and the command's own flags would then be refused as the CLI's.
  c->add_option("--env", f->env, "KEY=VALUE set in every rank's environment (repeatable)")
      ->allow_extra_args(false);
  c->add_option("--metadata", f->metadata, "KEY=VALUE kept with the job (repeatable)")
      ->allow_extra_args(false);
  c->add_flag("--no-wait", f->no_wait, "Return once submitted instead of following the logs");
  c->add_option("command", f->command, "The command each rank runs, after --")->required();
  c->callback([f, &exit_code] {
    // A duration the user left at the agent's default is not sent (a head of an earlier version
    // refuses fields it does not know); the longest back-off is at least the first, as `run` takes
    // them.
    const elastic::LaunchOptions& r = f->restarts;
    const elastic::LaunchOptions defaults;
    const auto unless_default = [](std::chrono::milliseconds value, std::chrono::milliseconds d) {
      return value == d ? std::nullopt : std::optional(value);
    };
    cluster::wire::JobSubmission submission{
        .entrypoint = elastic::shell_quote(f->command),
        .launch = {
            .nodes = f->nodes,
            .nproc_per_node = f->nproc_per_node,
            .max_restarts = r.max_restarts,
            .restart_backoff = unless_default(r.restart_backoff, defaults.restart_backoff),
            .restart_backoff_max = unless_default(
                std::max(r.restart_backoff_max, r.restart_backoff), defaults.restart_backoff_max),
            .hang_timeout = unless_default(r.hang_timeout, defaults.hang_timeout)}};
    for (const auto& kv : f->env) submission.env_vars.insert(key_value(kv, "--env"));
    for (const auto& kv : f->metadata) submission.metadata.insert(key_value(kv, "--metadata"));
    if (!f->submission_id.empty()) submission.submission_id = f->submission_id;
    if (f->num_cpus > 0) submission.entrypoint_num_cpus = f->num_cpus;
    if (f->num_gpus > 0) submission.entrypoint_num_gpus = f->num_gpus;
    auto client = make_client(f->client);
    const std::string id = submit_job(client, submission);
    std::printf(
        "------------------------------------------\n"
        "Job '%s' submitted successfully\n"
        "------------------------------------------\n\n"
        "Next steps\n"
        "  Query the logs of the job:\n    trainyard logs %s\n"
        "  Query the status of the job:\n    trainyard jobs\n"
        "  Request the job to be stopped:\n    trainyard stop %s\n\n",
        id.c_str(), id.c_str(), id.c_str());
    if (f->no_wait) {
      exit_code = 0;
      return;
    }
    std::printf("Tailing logs until the job exits (disable with --no-wait):\n");
    std::fflush(stdout);
    const auto job = follow(client, id, -1);
    print_final(job);
    exit_code = job.status == cluster::api::kSucceeded ? 0 : 1;
  });
}

void add_jobs(CLI::App& app, int& exit_code) {
  auto f = std::make_shared<ClientFlags>();
  auto as_json = std::make_shared<bool>(false);
  auto* c = app.add_subcommand("jobs", "The cluster's jobs, newest last");
  add_client_flags(*c, *f);
  c->add_flag("--json", *as_json, "Print the head's job list as JSON");
  c->callback([f, as_json, &exit_code] {
    auto client = make_client(*f);
    const json jobs = client.get(cluster::api::kJobsPath);
    if (*as_json) {
      std::printf("%s\n", jobs.dump(2).c_str());
    } else {
      std::printf("%-28s %-10s %-6s %-19s %-19s %s\n", "JOB ID", "STATUS", "NODES", "START", "END",
                  "ENTRYPOINT");
      for (const auto& j : jobs.get<std::vector<cluster::wire::JobDetails>>()) {
        std::printf("%-28s %-10s %-6s %-19s %-19s %s\n", j.job_id.c_str(), j.status.c_str(),
                    j.launch.nodes.c_str(), clock_time(j.start_time).c_str(),
                    clock_time(j.end_time).c_str(), shown(j.entrypoint).c_str());
        if (j.status == cluster::api::kFailed && !j.message.empty()) {
          std::printf("    %s\n", shown(j.message).c_str());
        }
      }
    }
    exit_code = 0;
  });
}

void add_logs(CLI::App& app, int& exit_code) {
  struct Flags {
    ClientFlags client;
    std::string id;
    bool follow = false;
    int rank = -1;
  };
  auto f = std::make_shared<Flags>();
  auto* c = app.add_subcommand("logs", "A job's logs, every line prefixed with node:rank");
  add_client_flags(*c, f->client);
  c->add_option("job", f->id, "The job's id")->required();
  c->add_flag("-f,--follow", f->follow, "Keep printing new lines until the job ends");
  c->add_option("--rank", f->rank, "Only this global rank's lines")->check(CLI::Range(0, 1 << 20));
  c->callback([f, &exit_code] {
    auto client = make_client(f->client);
    if (f->follow) {
      follow(client, f->id, f->rank);
    } else {
      client.get(cluster::api::job_path(f->id));  // an unknown id is a clear error, not empty logs
      print_new_logs(client, f->id, 0, f->rank);
    }
    exit_code = 0;
  });
}

void add_stop_and_delete(CLI::App& app, int& exit_code) {
  auto f = std::make_shared<ClientFlags>();
  auto id = std::make_shared<std::string>();
  auto* stop = app.add_subcommand("stop", "Stop a job's ranks on every node");
  add_client_flags(*stop, *f);
  stop->add_option("job", *id, "The job's id")->required();
  stop->callback([f, id, &exit_code] {
    auto client = make_client(*f);
    // Stopping twice is stopping once: the call may be retried.
    const auto answer = client
                            .post(cluster::api::job_stop_path(*id), json::object(),
                                  /*idempotent=*/true)
                            .get<cluster::wire::StopAnswer>();
    std::printf(answer.stopped ? "Job '%s' is stopping.\n" : "Job '%s' had already ended.\n",
                id->c_str());
    exit_code = 0;
  });
  auto g = std::make_shared<ClientFlags>();
  auto del_id = std::make_shared<std::string>();
  auto* del = app.add_subcommand("delete", "Delete an ended job and its logs from the head");
  add_client_flags(*del, *g);
  del->add_option("job", *del_id, "The job's id")->required();
  del->callback([g, del_id, &exit_code] {
    auto client = make_client(*g);
    client.del(cluster::api::job_path(*del_id));
    std::printf("Job '%s' deleted.\n", del_id->c_str());
    exit_code = 0;
  });
}

}  // namespace

void add_cluster_commands(CLI::App& app, int& exit_code) {
  add_status(app, exit_code);
  add_submit(app, exit_code);
  add_jobs(app, exit_code);
  add_logs(app, exit_code);
  add_stop_and_delete(app, exit_code);
}

}  // namespace trainyard::cli
