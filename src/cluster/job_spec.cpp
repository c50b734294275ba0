#include "trainyard/cluster/job_spec.h"

#include <chrono>
#include <random>
#include <set>

#include "trainyard/cluster/api.h"
#include "trainyard/error.h"

namespace trainyard::cluster {
namespace {

using nlohmann::json;
namespace f = api::field;

const char* type_name(const json& v) {
  if (v.is_string()) return "a string";
  if (v.is_number()) return "a number";
  if (v.is_boolean()) return "a boolean";
  if (v.is_null()) return "null";
  if (v.is_array()) return "an array";
  return "an object";
}

[[noreturn]] void wrong_type(const std::string& field, const char* expected, const json& v) {
  throw InvalidArgumentError("The field '" + field + "' must be " + expected + "; got " +
                             type_name(v) + ".");
}

void check_string_map(const std::string& field, const json& v) {
  if (!v.is_object()) wrong_type(field, "an object of strings", v);
  for (const auto& [k, x] : v.items()) {
    if (!x.is_string()) wrong_type(field + "." + k, "a string", x);
  }
}

std::optional<double> optional_number(const json& body, const char* field) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) wrong_type(field, "a number", *it);
  double v = it->get<double>();
  if (v < 0) {
    throw InvalidArgumentError(std::string("The field '") + field + "' must not be negative; got " +
                               std::to_string(v) + ".");
  }
  return v;
}

int positive_int(const json& v, const std::string& field, int minimum) {
  if (!v.is_number_integer()) wrong_type(field, "an integer", v);
  int x = v.get<int>();
  if (x < minimum) {
    throw InvalidArgumentError("The field '" + field + "' must be at least " +
                               std::to_string(minimum) + "; got " + std::to_string(x) + ".");
  }
  return x;
}

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

JobRecord job_from_submission(const json& body) {
  if (!body.is_object()) {
    throw InvalidArgumentError(std::string("The request body must be a JSON object; got ") +
                               type_name(body) + ".");
  }
  // Ray's JobSubmitRequest fields (job_id and entrypoint_memory are accepted as Ray's client
  // sends them) and trainyard's extension.
  static const std::set<std::string> kKnown = {
      f::kEntrypoint,        f::kSubmissionId,    "job_id",
      f::kRuntimeEnv,        f::kMetadata,        f::kEntrypointNumCpus,
      f::kEntrypointNumGpus, "entrypoint_memory", f::kEntrypointResources,
      f::kTrainyard};
  std::vector<std::string> unknown;
  for (const auto& [k, v] : body.items()) {
    if (!kKnown.count(k)) unknown.push_back(k);
  }
  if (!unknown.empty()) {
    std::string names;
    for (const auto& u : unknown) names += (names.empty() ? "'" : ", '") + u + "'";
    throw InvalidArgumentError("Unknown field" + std::string(unknown.size() > 1 ? "s " : " ") +
                               names +
                               " in the job submission. Known fields: entrypoint, "
                               "submission_id, runtime_env, metadata, entrypoint_num_cpus, "
                               "entrypoint_num_gpus, entrypoint_resources, trainyard.");
  }
  JobRecord job;
  auto ep = body.find(f::kEntrypoint);
  if (ep == body.end() || ep->is_null()) {
    throw InvalidArgumentError("The field 'entrypoint' is missing: give the shell command to run.");
  }
  if (!ep->is_string()) wrong_type(f::kEntrypoint, "a string", *ep);
  job.entrypoint = ep->get<std::string>();
  if (job.entrypoint.empty()) {
    throw InvalidArgumentError("The field 'entrypoint' is empty: give the shell command to run.");
  }
  for (const char* id_field : {f::kSubmissionId, "job_id"}) {
    auto it = body.find(id_field);
    if (it == body.end() || it->is_null()) continue;
    if (!it->is_string()) wrong_type(id_field, "a string", *it);
    std::string id = it->get<std::string>();
    // Ids become folder names on the workers and parts of URL paths: no leading '.'.
    if (id.empty() || id.size() > 128 || id.front() == '.' ||
        id.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") !=
            std::string::npos) {
      throw InvalidArgumentError(std::string("The field '") + id_field + "' must be 1 to 128 " +
                                 "letters, digits, '_', '.' or '-', not starting with '.'; got \"" +
                                 id + "\".");
    }
    if (job.submission_id.empty()) job.submission_id = id;
  }
  if (job.submission_id.empty()) job.submission_id = make_submission_id();
  job.job_id = job.submission_id;

  if (auto it = body.find(f::kRuntimeEnv); it != body.end() && !it->is_null()) {
    if (!it->is_object()) wrong_type(f::kRuntimeEnv, "an object", *it);
    std::vector<std::string> bad;
    for (const auto& [k, v] : it->items()) {
      if (k != f::kEnvVars) bad.push_back(k);
    }
    if (!bad.empty()) {
      std::string names;
      for (const auto& b : bad) names += (names.empty() ? "'" : ", '") + b + "'";
      throw InvalidArgumentError(
          "The runtime_env key" + std::string(bad.size() > 1 ? "s " : " ") + names +
          (bad.size() > 1 ? " are" : " is") +
          " not supported: trainyard runs the entrypoint in the worker's own environment and "
          "takes only runtime_env.env_vars. Hint: install packages on the nodes and reach files "
          "by paths they share.");
    }
    if (auto env = it->find(f::kEnvVars); env != it->end() && !env->is_null()) {
      check_string_map("runtime_env.env_vars", *env);
      job.runtime_env = json{{f::kEnvVars, *env}};
    }
  }
  if (auto it = body.find(f::kMetadata); it != body.end() && !it->is_null()) {
    check_string_map(f::kMetadata, *it);
    job.metadata = *it;
  }
  job.entrypoint_num_cpus = optional_number(body, f::kEntrypointNumCpus);
  job.entrypoint_num_gpus = optional_number(body, f::kEntrypointNumGpus);
  optional_number(body, "entrypoint_memory");
  if (auto it = body.find(f::kEntrypointResources); it != body.end() && !it->is_null()) {
    if (!it->is_object()) wrong_type(f::kEntrypointResources, "an object of numbers", *it);
    for (const auto& [k, v] : it->items()) {
      if (!v.is_number()) wrong_type(std::string(f::kEntrypointResources) + "." + k, "a number", v);
    }
    job.entrypoint_resources = *it;
  }
  if (auto it = body.find(f::kTrainyard); it != body.end() && !it->is_null()) {
    if (!it->is_object()) wrong_type(f::kTrainyard, "an object", *it);
    for (const auto& [k, v] : it->items()) {
      if (k == f::kNodes) {
        if (v.is_number_integer()) {
          job.nodes = std::to_string(v.get<long long>());
        } else if (v.is_string()) {
          job.nodes = v.get<std::string>();
        } else {
          wrong_type("trainyard.nodes", "a string \"N\" or \"MIN:MAX\"", v);
        }
      } else if (k == f::kNprocPerNode) {
        job.nproc_per_node = positive_int(v, "trainyard.nproc_per_node", 1);
      } else if (k == f::kMaxRestarts) {
        job.max_restarts = positive_int(v, "trainyard.max_restarts", 0);
      } else {
        throw InvalidArgumentError("Unknown field 'trainyard." + k +
                                   "' in the job submission. Known: nodes, nproc_per_node, "
                                   "max_restarts.");
      }
    }
  }
  std::tie(job.min_nodes, job.max_nodes) = parse_nodes(job.nodes);
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
  return job.nproc_per_node * job.entrypoint_num_cpus.value_or(1.0);
}

double job_gpus_per_node(const JobRecord& job) {
  return job.nproc_per_node * job.entrypoint_num_gpus.value_or(0.0);
}

json job_details(const JobRecord& job, const std::optional<std::string>& token) {
  json runtime_env = job.runtime_env;
  if (token && runtime_env.contains(f::kEnvVars)) {
    for (auto& [k, v] : runtime_env[f::kEnvVars].items()) {
      if (v.is_string()) v = redact(v.get<std::string>(), token);
    }
  }
  json ty = {{f::kNodes, job.nodes},
             {f::kNprocPerNode, job.nproc_per_node},
             {f::kMaxRestarts, job.max_restarts},
             {f::kAssignedNodes, job.assigned_nodes},
             {f::kFailedRank, job.failed_rank ? json(*job.failed_rank) : json(nullptr)},
             {f::kFailedNode, job.failed_node ? json(*job.failed_node) : json(nullptr)},
             {f::kLastLines, json::array()},
             {f::kDemand, nullptr}};
  for (const auto& line : job.last_lines) ty[f::kLastLines].push_back(redact(line, token));
  if (job.status == api::kPending && job.assigned_nodes.empty()) {
    ty[f::kDemand] = {{"CPU", job_cpus_per_node(job) * job.min_nodes},
                      {"GPU", job_gpus_per_node(job) * job.min_nodes}};
  }
  return json{
      {"type", "SUBMISSION"},
      {f::kJobId, job.job_id},
      {f::kSubmissionId, job.submission_id},
      {"driver_info", nullptr},
      {f::kStatus, job.status},
      {f::kEntrypoint, redact(job.entrypoint, token)},
      {f::kMessage, redact(job.message, token)},
      {f::kErrorType, job.error_type.empty() ? json(nullptr) : json(job.error_type)},
      {f::kStartTime, job.start_time_ms},
      {f::kEndTime, job.end_time_ms ? json(*job.end_time_ms) : json(nullptr)},
      {f::kMetadata, job.metadata},
      {f::kRuntimeEnv, runtime_env},
      {"driver_agent_http_address", nullptr},
      {"driver_node_id", job.assigned_nodes.empty() ? json(nullptr) : json(job.assigned_nodes[0])},
      {f::kDriverExitCode, job.driver_exit_code ? json(*job.driver_exit_code) : json(nullptr)},
      {f::kEntrypointNumCpus,
       job.entrypoint_num_cpus ? json(*job.entrypoint_num_cpus) : json(nullptr)},
      {f::kEntrypointNumGpus,
       job.entrypoint_num_gpus ? json(*job.entrypoint_num_gpus) : json(nullptr)},
      {f::kEntrypointResources, job.entrypoint_resources},
      {f::kTrainyard, ty}};
}

}  // namespace trainyard::cluster
