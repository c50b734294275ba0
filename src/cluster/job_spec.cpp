#include "trainyard/cluster/job_spec.h"

#include <chrono>
#include <random>

#include "trainyard/cluster/api.h"
#include "trainyard/error.h"

namespace trainyard::cluster {
namespace {

using nlohmann::json;

std::string redact(std::string s, const std::optional<std::string>& token) {
  if (!token || token->empty()) return s;
  for (size_t pos = s.find(*token); pos != std::string::npos; pos = s.find(*token, pos)) {
    s.replace(pos, token->size(), "<redacted>");
    pos += 10;
  }
  return s;
}

}  // namespace

std::pair<int, int> parse_nodes(const std::string& nodes) {
  auto parse = [&](const std::string& s) {
    if (s.empty() || s.size() > 6 || s.find_first_not_of("0123456789") != std::string::npos)
      return -1;
    return std::stoi(s);
  };
  size_t colon = nodes.find(':');
  int lo = parse(nodes.substr(0, colon));
  int hi = colon == std::string::npos ? lo : parse(nodes.substr(colon + 1));
  if (lo < 1 || hi < lo) {
    throw InvalidArgumentError(
        "The field 'trainyard.nodes' must be \"N\" or \"MIN:MAX\" with "
        "1 <= MIN <= MAX; got \"" +
        nodes + "\".");
  }
  return {lo, hi};
}

JobRecord job_from_submission(const wire::JobSubmission& submission) {
  JobRecord job;
  job.entrypoint = submission.entrypoint;
  job.submission_id = submission.submission_id.value_or(make_submission_id());
  job.job_id = job.submission_id;
  job.env_vars = submission.env_vars;
  job.metadata = submission.metadata;
  job.entrypoint_num_cpus = submission.entrypoint_num_cpus;
  job.entrypoint_num_gpus = submission.entrypoint_num_gpus;
  job.entrypoint_resources = submission.entrypoint_resources;
  job.launch = submission.launch;
  std::tie(job.min_nodes, job.max_nodes) = parse_nodes(job.launch.nodes);
  job.status = api::kPending;
  job.start_time_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  return job;
}

std::string make_submission_id() {
  static constexpr char kAlphabet[] =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::random_device rd;
  std::uniform_int_distribution<int> pick(0, sizeof(kAlphabet) - 2);
  std::string id = "raysubmit_";
  for (int i = 0; i < 16; ++i) id += kAlphabet[pick(rd)];
  return id;
}

double job_cpus_per_node(const JobRecord& job) {
  return job.launch.nproc_per_node * job.entrypoint_num_cpus.value_or(1.0);
}

double job_gpus_per_node(const JobRecord& job) {
  return job.launch.nproc_per_node * job.entrypoint_num_gpus.value_or(0.0);
}

json job_details(const JobRecord& job,
                 const std::optional<std::string>& token,
                 bool logs_complete) {
  wire::JobDetails d{
      .job_id = job.job_id,
      .submission_id = job.submission_id,
      .status = job.status,
      .entrypoint = redact(job.entrypoint, token),
      .message = redact(job.message, token),
      .error_type = job.error_type.empty() ? std::nullopt : std::optional(job.error_type),
      .start_time = job.start_time_ms,
      .end_time = job.end_time_ms,
      .metadata = job.metadata,
      .env_vars = job.env_vars,
      .driver_node_id =
          job.assigned_nodes.empty() ? std::nullopt : std::optional(job.assigned_nodes[0]),
      .driver_exit_code = job.driver_exit_code,
      .entrypoint_num_cpus = job.entrypoint_num_cpus,
      .entrypoint_num_gpus = job.entrypoint_num_gpus,
      .entrypoint_resources = job.entrypoint_resources,
      .launch = job.launch,
      .assigned_nodes = job.assigned_nodes,
      .failed_rank = job.failed_rank,
      .failed_node = job.failed_node,
      .logs_complete = logs_complete};
  for (auto& [k, v] : d.env_vars) v = redact(v, token);
  for (const auto& line : job.last_lines) d.last_lines.push_back(redact(line, token));
  if (job.status == api::kPending && job.assigned_nodes.empty()) {
    d.demand = wire::JobDemand{.cpu = job_cpus_per_node(job) * job.min_nodes,
                               .gpu = job_gpus_per_node(job) * job.min_nodes};
  }
  return d;
}

}  // namespace trainyard::cluster
