#include "trainyard/cluster/wire.h"

#include <array>
#include <cmath>
#include <set>

#include "cluster/json_fields.h"
#include "trainyard/cluster/api.h"
#include "trainyard/elastic/launcher.h"
#include "trainyard/env.h"

// Note [Message limits]
// Everything a client sends the head is kept (SQLite), repeated (every job listing carries each
// job's entrypoint, metadata and env) and handed on (the entrypoint and env become a process's
// argv and environment on the workers). So every message is bounded before it is believed:
//  - nesting depth, before parsing: nlohmann's parser builds deep documents without recursion,
//    but copying or printing one recurses, and 200,000 levels overflow a server thread's stack;
//  - the request body, by the HTTP server (HttpServerOptions::max_body_bytes);
//  - each field: ids and names to what a folder, a URL segment or a host name needs; the
//    entrypoint to Linux's MAX_ARG_STRLEN (128 KiB), the longest single argument execve takes,
//    which `/bin/sh -c ENTRYPOINT` must pass; env vars to 256 of them and 256 KiB in all (each
//    is a string in every rank's environment, which shares execve's ARG_MAX with argv); metadata
//    to 16 KiB, which Ray's clients use for a few labels. A field past its limit is a
//    MessageTooLargeError, which the head answers with 413 naming the limit.

namespace trainyard::cluster::wire {

using nlohmann::json;
namespace f = api::field;
namespace jf = json_fields;

namespace {

constexpr std::array<std::pair<ReportState, std::string_view>, 4> kReportStateNames{{
    {ReportState::kRunning, api::kReportRunning},
    {ReportState::kSucceeded, api::kReportSucceeded},
    {ReportState::kFailed, api::kReportFailed},
    {ReportState::kStopped, api::kReportStopped},
}};

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

void check_size(const std::string& field, std::size_t bytes, std::size_t limit, const char* why) {
  if (bytes <= limit) return;
  throw MessageTooLargeError(detail::concat("The field '", field, "' is ", bytes,
                                            " bytes; the limit is ", limit, " bytes", why, "."));
}

// A string field: absent or null gives nullopt; longer than max_bytes is MessageTooLargeError.
std::optional<std::string> optional_string(const json& j,
                                           const char* object,
                                           const char* name,
                                           std::size_t max_bytes) {
  const auto it = j.find(name);
  if (it == j.end() || it->is_null()) return std::nullopt;
  const std::string path = object[0] ? std::string(object) + "." + name : std::string(name);
  if (!it->is_string()) wrong_type(path, "a string", *it);
  const auto& s = it->get_ref<const std::string&>();
  check_size(path, s.size(), max_bytes, "");
  return s;
}

std::string required_string(const json& j,
                            const char* object,
                            const char* name,
                            std::size_t max_bytes) {
  auto s = optional_string(j, object, name, max_bytes);
  if (!s || s->empty()) {
    throw InvalidArgumentError(detail::concat("The field '",
                                              object[0] ? std::string(object) + "." : std::string(),
                                              name, "' is missing or is not a non-empty string."));
  }
  return *s;
}

// An object of strings, at most max_entries of them and max_bytes of keys and values together.
// A NUL byte would cut a command, an environment value or name where the C side ends it, so that
// something other than what was sent runs: refused, naming the field.
void check_no_nul(const std::string& field, std::string_view text) {
  if (const auto at = text.find('\0'); at != std::string_view::npos)
    throw InvalidArgumentError(detail::concat(
        "The field '", field, "' holds a NUL byte at offset ", at,
        ": a command or an environment variable cannot carry one (it would be cut there). Hint: "
        "remove it; pass binary data in a file."));
}

std::map<std::string, std::string> string_map(const std::string& field,
                                              const json& v,
                                              std::size_t max_entries,
                                              std::size_t max_bytes,
                                              const char* why) {
  if (!v.is_object()) wrong_type(field, "an object of strings", v);
  if (v.size() > max_entries) {
    throw MessageTooLargeError(detail::concat("The field '", field, "' has ", v.size(),
                                              " entries; the limit is ", max_entries, why, "."));
  }
  std::map<std::string, std::string> out;
  std::size_t bytes = 0;
  for (const auto& [k, x] : v.items()) {
    if (!x.is_string()) wrong_type(field + "." + k, "a string", x);
    check_no_nul(field + " key", k);
    check_no_nul(field + "." + k, x.get_ref<const std::string&>());
    bytes += k.size() + x.get_ref<const std::string&>().size();
    out.emplace(k, x.get<std::string>());
  }
  check_size(field, bytes, max_bytes, why);
  return out;
}

// runtime_env.env_vars as a process environment takes them: a name that is not empty and has no
// '=', and none of the variables the launcher sets for each rank (torchrun's contract), which
// the job's own would silently replace or be replaced by.
void check_env_vars(const std::map<std::string, std::string>& env) {
  static const std::set<std::string_view> kContract = {
      kRankEnv,          kLocalRankEnv,      kWorldSizeEnv,  kLocalWorldSizeEnv,
      kGroupRankEnv,     kGroupWorldSizeEnv, kRoleRankEnv,   kRoleNameEnv,
      kRoleWorldSizeEnv, kMasterAddrEnv,     kMasterPortEnv, kJobInstanceEnv,
      kHeartbeatFileEnv, kMetricsDirEnv,     kBindAddrEnv,   kJobIdEnv};
  for (const auto& [name, value] : env) {
    if (name.empty() || name.find('=') != std::string::npos)
      throw InvalidArgumentError(detail::concat(
          "runtime_env.env_vars has the name '", name.substr(0, kMaxNameBytes),
          "', which is not an environment variable's name (empty, or holding '='). Hint: give "
          "NAME: VALUE pairs."));
    if (kContract.count(name) || name.starts_with("TORCHELASTIC_"))
      throw InvalidArgumentError(detail::concat(
          "runtime_env.env_vars sets ", name,
          ", which the launcher sets for each rank (torchrun's contract). Hint: give the job's "
          "size with trainyard.nodes and trainyard.nproc_per_node, and leave the rank "
          "variables to the launcher."));
  }
}

std::optional<double> non_negative_number(const json& body, const char* field) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) wrong_type(field, "a number", *it);
  double v = it->get<double>();
  if (v < 0) {
    throw InvalidArgumentError(std::string("The field '") + field + "' must not be negative; got " +
                               std::to_string(v) + ".");
  }
  // A rank's share of a node: far below this on any machine, and multiplied by ranks and nodes
  // it must stay a finite number.
  if (!(v <= kMaxResourceAmount)) {
    throw InvalidArgumentError(detail::concat("The field '", field, "' must be at most ",
                                              kMaxResourceAmount, " per rank; got ", v, "."));
  }
  return v;
}

int int_at_least(const json& v, const std::string& field, int minimum) {
  if (!v.is_number_integer()) wrong_type(field, "an integer", v);
  const auto x = v.get<std::int64_t>();
  if (x < minimum || x > INT32_MAX) {
    throw InvalidArgumentError("The field '" + field + "' must be an integer from " +
                               std::to_string(minimum) + " to " + std::to_string(INT32_MAX) +
                               "; got " + std::to_string(x) + ".");
  }
  return static_cast<int>(x);
}

// A duration field: a number of seconds from 0 to `max`, as the launch flags take it.
std::chrono::milliseconds seconds_at(const json& v,
                                     const std::string& field,
                                     std::chrono::seconds max) {
  if (!v.is_number()) wrong_type(field, "a number of seconds", v);
  const double s = v.get<double>();
  if (!(s >= 0 && s <= static_cast<double>(max.count())))
    throw InvalidArgumentError(detail::concat("The field '", field,
                                              "' must be a number of seconds from 0 to ",
                                              max.count(), "; got ", s, "."));
  return std::chrono::milliseconds(std::llround(s * 1000));
}

// The JobLaunch fields of object `j` (`prefix` before their names in errors); absent or null ones
// keep their defaults.
JobLaunch launch_from(const json& j, const std::string& prefix) {
  JobLaunch v;
  const auto field = [&](const char* name) -> const json* {
    const auto it = j.find(name);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  };
  if (const json* x = field(f::kNodes)) {
    if (x->is_number_integer()) {
      v.nodes = std::to_string(x->get<long long>());
    } else if (x->is_string()) {
      v.nodes = x->get<std::string>().substr(0, 64);
    } else {
      wrong_type(prefix + f::kNodes, "a string \"N\" or \"MIN:MAX\"", *x);
    }
  }
  if (const json* x = field(f::kNprocPerNode))
    v.nproc_per_node = int_at_least(*x, prefix + f::kNprocPerNode, 1);
  if (const json* x = field(f::kMaxRestarts))
    v.max_restarts = int_at_least(*x, prefix + f::kMaxRestarts, 0);
  if (const json* x = field(f::kRestartBackoff))
    v.restart_backoff = seconds_at(*x, prefix + f::kRestartBackoff, elastic::kMaxRestartBackoff);
  if (const json* x = field(f::kRestartBackoffMax))
    v.restart_backoff_max =
        seconds_at(*x, prefix + f::kRestartBackoffMax, elastic::kMaxRestartBackoff);
  if (const json* x = field(f::kHangTimeout))
    v.hang_timeout = seconds_at(*x, prefix + f::kHangTimeout, elastic::kMaxHangTimeout);
  return v;
}

// Writes `v` into object `j`; a duration left to the agent's default is left out.
void put_launch(json& j, const JobLaunch& v) {
  j[f::kNodes] = v.nodes;
  j[f::kNprocPerNode] = v.nproc_per_node;
  j[f::kMaxRestarts] = v.max_restarts;
  const auto put = [&j](const char* name, const std::optional<std::chrono::milliseconds>& d) {
    if (d) j[name] = static_cast<double>(d->count()) / 1000;
  };
  put(f::kRestartBackoff, v.restart_backoff);
  put(f::kRestartBackoffMax, v.restart_backoff_max);
  put(f::kHangTimeout, v.hang_timeout);
}

void check_id(const std::string& field, const std::string& id) {
  // Ids become folder names on the workers and parts of URL paths: no leading '.'.
  if (id.empty() || id.size() > kMaxIdBytes || id.front() == '.' ||
      id.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") !=
          std::string::npos) {
    throw InvalidArgumentError(detail::concat("The field '", field, "' must be 1 to ", kMaxIdBytes,
                                              " letters, digits, '_', '.' or '-', not starting "
                                              "with '.'; got \"",
                                              id.substr(0, kMaxIdBytes + 1), "\"."));
  }
}

json optional_json(const auto& v) {
  return v ? json(*v) : json(nullptr);
}

}  // namespace

// --- parsing -------------------------------------------------------------------------------------

nlohmann::json parse_message(std::string_view text, std::string_view what) {
  if (text.empty()) return json::object();
  // Depth first, on the text: nothing is built from a document nested too deep.
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxDepth) {
        throw InvalidArgumentError(detail::concat(
            "The ", what, " nests arrays and objects deeper than ", kMaxDepth, " levels."));
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    throw InvalidArgumentError(detail::concat("The ", what, " is not valid JSON."));
  return j;
}

std::string_view to_string(ReportState state) {
  for (const auto& [value, name] : kReportStateNames)
    if (value == state) return name;
  TY_ASSERT(false, "unknown ReportState ", static_cast<int>(state));
  return "unknown";
}

// --- the worker protocol -------------------------------------------------------------------------

void to_json(json& j, const JobReport& v) {
  j = json{{f::kJobId, v.job_id},
           {f::kInstance, v.instance},
           {f::kState, to_string(v.state)},
           {f::kRestartCount, v.restart_count},
           {f::kRanks, v.ranks}};
  if (v.world_size) j[f::kWorldSize] = *v.world_size;
  if (v.exit_code) j[f::kExitCode] = *v.exit_code;
  if (v.failed_rank) j[f::kFailedRank] = *v.failed_rank;
  if (!v.error_type.empty()) j[f::kErrorType] = v.error_type;
  if (!v.message.empty()) j[f::kMessage] = v.message;
  if (!v.last_lines.empty()) j[f::kLastLines] = v.last_lines;
  if (v.line_count) j[f::kLineCount] = *v.line_count;
}

void from_json(const json& j, JobReport& v) {
  const jf::Context c{"job report"};
  if (!j.is_object()) wrong_type("jobs[]", "an object", j);
  v.job_id = required_string(j, "", f::kJobId, kMaxIdBytes);
  v.instance = jf::optional_or<Instance>(j, c, f::kInstance, 0);
  const auto state = jf::required<std::string>(j, c, f::kState);
  bool known = false;
  for (const auto& [value, name] : kReportStateNames) {
    if (name == state) {
      v.state = value;
      known = true;
    }
  }
  TY_CHECK(known, "The job report's state must be running, succeeded, failed or stopped; got '",
           state.substr(0, 40), "'.");
  v.restart_count = jf::optional_or<int>(j, c, f::kRestartCount, 0);
  v.ranks = jf::optional_list<int>(j, c, f::kRanks, 1 << 16);
  v.world_size = jf::optional<int>(j, c, f::kWorldSize);
  v.exit_code = jf::optional<int>(j, c, f::kExitCode);
  v.failed_rank = jf::optional<int>(j, c, f::kFailedRank);
  v.error_type = optional_string(j, "", f::kErrorType, kMaxNameBytes).value_or("");
  v.message = optional_string(j, "", f::kMessage, kMaxMessageBytes).value_or("");
  v.last_lines = jf::optional_list<std::string>(j, c, f::kLastLines, kMaxLastLines);
  for (const auto& line : v.last_lines)
    check_size("last_lines[]", line.size(), kMaxMessageBytes, "");
  v.line_count = jf::optional<std::int64_t>(j, c, f::kLineCount);
  TY_CHECK(!v.line_count || *v.line_count >= 0, "The job report's line_count must be >= 0, got ",
           v.line_count.value_or(0), ".");
}

void to_json(json& j, const Registration& v) {
  j = json{{f::kNodeId, v.node_id},
           {f::kHostname, v.hostname},
           {f::kAddress, v.address},
           {f::kResources, v.resources},
           {f::kJobs, v.jobs}};
}

void from_json(const json& j, Registration& v) {
  if (!j.is_object()) wrong_type("registration", "an object", j);
  v.node_id = required_string(j, "", f::kNodeId, kMaxIdBytes);
  check_id(f::kNodeId, v.node_id);
  v.hostname = optional_string(j, "", f::kHostname, kMaxNameBytes).value_or("");
  v.address = optional_string(j, "", f::kAddress, kMaxNameBytes).value_or("");
  v.resources = jf::required<NodeResources>(j, {"registration"}, f::kResources);
  v.jobs = jf::optional_list<JobReport>(j, {"registration"}, f::kJobs, kMaxJobsPerReport);
}

void to_json(json& j, const RegistrationAnswer& v) {
  j = json{{f::kHeartbeatIntervalMs, v.heartbeat_interval_ms}};
}

void from_json(const json& j, RegistrationAnswer& v) {
  v.heartbeat_interval_ms =
      jf::required<std::int64_t>(j, {"registration answer"}, f::kHeartbeatIntervalMs);
}

void to_json(json& j, const Usage& v) {
  j = json{{f::kCpuUsed, v.cpu_used},
           {f::kCpuFraction, v.cpu_fraction},
           {f::kMemoryUsedBytes, v.memory_used_bytes}};
}

void from_json(const json& j, Usage& v) {
  const jf::Context c{"heartbeat's usage"};
  v.cpu_used = jf::optional_or<double>(j, c, f::kCpuUsed, 0);
  v.cpu_fraction = jf::optional_or<double>(j, c, f::kCpuFraction, 0);
  v.memory_used_bytes = jf::optional_or<std::int64_t>(j, c, f::kMemoryUsedBytes, 0);
}

void to_json(json& j, const Heartbeat& v) {
  j = json{{f::kUsage, v.usage}, {f::kJobs, v.jobs}, {f::kMetrics, v.metrics}};
}

void from_json(const json& j, Heartbeat& v) {
  if (!j.is_object()) wrong_type("heartbeat", "an object", j);
  v.usage = jf::optional_or<Usage>(j, {"heartbeat"}, f::kUsage, Usage{});
  v.jobs = jf::optional_list<JobReport>(j, {"heartbeat"}, f::kJobs, kMaxJobsPerReport);
  const auto m = j.find(f::kMetrics);
  v.metrics = m == j.end() ? json(nullptr) : *m;
}

void to_json(json& j, const Assignment& v) {
  j = json{{f::kJobId, v.job_id}, {f::kInstance, v.instance},  {f::kEntrypoint, v.entrypoint},
           {f::kEnv, v.env},      {f::kMinNodes, v.min_nodes}, {f::kMaxNodes, v.max_nodes}};
  put_launch(j, v.launch);
}

void from_json(const json& j, Assignment& v) {
  if (!j.is_object()) wrong_type("assignments[]", "an object", j);
  v.job_id = required_string(j, "", f::kJobId, kMaxIdBytes);
  check_id(f::kJobId, v.job_id);
  v.instance = jf::optional_or<Instance>(j, {"assignment"}, f::kInstance, 0);
  v.entrypoint = required_string(j, "", f::kEntrypoint, kMaxEntrypointBytes);
  const auto env = j.find(f::kEnv);
  v.env = env == j.end() || env->is_null()
              ? std::map<std::string, std::string>{}
              : string_map(f::kEnv, *env, kMaxEnvVars, kMaxEnvBytes, "");
  const auto number = [&](const char* name, int fallback, int minimum) {
    const auto it = j.find(name);
    return it == j.end() || it->is_null() ? fallback : int_at_least(*it, name, minimum);
  };
  v.launch = launch_from(j, "");
  v.min_nodes = number(f::kMinNodes, 1, 1);
  v.max_nodes = number(f::kMaxNodes, v.min_nodes, v.min_nodes);
}

void to_json(json& j, const HeartbeatAnswer& v) {
  j = json{{f::kRegistered, v.registered}, {f::kAssignments, v.assignments}, {f::kStop, v.stop}};
}

void from_json(const json& j, HeartbeatAnswer& v) {
  const jf::Context c{"heartbeat answer"};
  v.registered = jf::optional_or<bool>(j, c, f::kRegistered, true);
  v.assignments = jf::optional_list<Assignment>(j, c, f::kAssignments);
  v.stop = jf::optional_list<std::string>(j, c, f::kStop);
}

void to_json(json& j, const LeaveRequest& v) {
  j = json{{f::kReason, v.reason}};
}

void from_json(const json& j, LeaveRequest& v) {
  v.reason =
      optional_string(j, "", f::kReason, kMaxNameBytes).value_or(std::string(api::kNodeExited));
  if (v.reason != api::kNodeExited && v.reason != api::kNodeDrained) {
    throw InvalidArgumentError("The field 'reason' must be \"exited\" or \"drained\"; got \"" +
                               v.reason + "\".");
  }
}

void to_json(json& j, const LogEntry& v) {
  j = json{{f::kRank, v.rank}, {f::kText, v.text}};
}

void from_json(const json& j, LogEntry& v) {
  const auto text = j.is_object() ? j.find(f::kText) : j.end();
  if (!j.is_object() || text == j.end() || !text->is_string()) {
    throw InvalidArgumentError("Every entry of 'lines' must be {\"rank\": int, \"text\": str}.");
  }
  v.rank = jf::optional_or<int>(j, {"log line"}, f::kRank, 0);
  v.text = text->get<std::string>();
}

void to_json(json& j, const LogBatch& v) {
  j = json{{f::kNodeId, v.node_id},
           {f::kInstance, v.instance},
           {f::kFirstSeq, v.first_seq},
           {f::kLines, v.lines}};
}

void from_json(const json& j, LogBatch& v) {
  if (!j.is_object()) wrong_type("log batch", "an object", j);
  v.node_id = required_string(j, "", f::kNodeId, kMaxIdBytes);
  v.instance = jf::optional_or<Instance>(j, {"log batch"}, f::kInstance, 0);
  const auto fs = j.find(f::kFirstSeq);
  if (fs == j.end() || !fs->is_number_integer() || fs->get<std::int64_t>() < 0) {
    throw InvalidArgumentError("The field 'first_seq' must be a non-negative integer.");
  }
  v.first_seq = fs->get<std::int64_t>();
  const auto ls = j.find(f::kLines);
  if (ls == j.end() || !ls->is_array()) {
    throw InvalidArgumentError("The field 'lines' must be an array of {rank, text}.");
  }
  if (ls->size() > kMaxLogLinesPerBatch) {
    throw MessageTooLargeError(detail::concat("The field 'lines' has ", ls->size(),
                                              " entries; the limit is ", kMaxLogLinesPerBatch,
                                              "."));
  }
  v.lines = ls->get<std::vector<LogEntry>>();
}

void to_json(json& j, const LogBatchAnswer& v) {
  j = json{{f::kNextSeq, v.next_seq}};
}

void from_json(const json& j, LogBatchAnswer& v) {
  v.next_seq = jf::required<std::int64_t>(j, {"log batch answer"}, f::kNextSeq);
}

// --- the Jobs API --------------------------------------------------------------------------------

void to_json(json& j, const JobSubmission& v) {
  j = json{{f::kEntrypoint, v.entrypoint},
           {f::kRuntimeEnv, {{f::kEnvVars, v.env_vars}}},
           {f::kMetadata, v.metadata},
           {f::kTrainyard, json::object()}};
  put_launch(j[f::kTrainyard], v.launch);
  if (v.submission_id) j[f::kSubmissionId] = *v.submission_id;
  if (v.entrypoint_num_cpus) j[f::kEntrypointNumCpus] = *v.entrypoint_num_cpus;
  if (v.entrypoint_num_gpus) j[f::kEntrypointNumGpus] = *v.entrypoint_num_gpus;
  if (!v.entrypoint_resources.empty()) j[f::kEntrypointResources] = v.entrypoint_resources;
}

void from_json(const json& body, JobSubmission& v) {
  if (!body.is_object()) {
    throw InvalidArgumentError(std::string("The request body must be a JSON object; got ") +
                               type_name(body) + ".");
  }
  // Ray's JobSubmitRequest fields (job_id and entrypoint_memory are accepted as Ray's client
  // sends them) and trainyard's extension.
  static const std::set<std::string> kKnown = {
      f::kEntrypoint,        f::kSubmissionId,     f::kJobId,
      f::kRuntimeEnv,        f::kMetadata,         f::kEntrypointNumCpus,
      f::kEntrypointNumGpus, f::kEntrypointMemory, f::kEntrypointResources,
      f::kTrainyard};
  std::string unknown;
  std::size_t unknown_count = 0;
  for (const auto& [k, x] : body.items()) {
    if (kKnown.count(k)) continue;
    ++unknown_count;
    unknown += (unknown.empty() ? "'" : ", '") + k.substr(0, kMaxNameBytes) + "'";
  }
  if (unknown_count > 0) {
    throw InvalidArgumentError("Unknown field" + std::string(unknown_count > 1 ? "s " : " ") +
                               unknown +
                               " in the job submission. Known fields: entrypoint, "
                               "submission_id, runtime_env, metadata, entrypoint_num_cpus, "
                               "entrypoint_num_gpus, entrypoint_resources, trainyard.");
  }
  v = JobSubmission{};
  const auto ep = body.find(f::kEntrypoint);
  if (ep == body.end() || ep->is_null()) {
    throw InvalidArgumentError("The field 'entrypoint' is missing: give the shell command to run.");
  }
  if (!ep->is_string()) wrong_type(f::kEntrypoint, "a string", *ep);
  v.entrypoint = ep->get<std::string>();
  if (v.entrypoint.empty()) {
    throw InvalidArgumentError("The field 'entrypoint' is empty: give the shell command to run.");
  }
  check_no_nul(f::kEntrypoint, v.entrypoint);
  check_size(f::kEntrypoint, v.entrypoint.size(), kMaxEntrypointBytes,
             " (Linux's MAX_ARG_STRLEN: the longest argument `/bin/sh -c` can be given). Hint: "
             "put a long command into a script on a path the nodes share and run that");
  for (const char* id_field : {f::kSubmissionId, f::kJobId}) {
    auto it = body.find(id_field);
    if (it == body.end() || it->is_null()) continue;
    if (!it->is_string()) wrong_type(id_field, "a string", *it);
    std::string id = it->get<std::string>();
    check_id(id_field, id);
    if (!v.submission_id) v.submission_id = id;
  }
  if (auto it = body.find(f::kRuntimeEnv); it != body.end() && !it->is_null()) {
    if (!it->is_object()) wrong_type(f::kRuntimeEnv, "an object", *it);
    // Ray's client adds _ray_commit, its own version, beside pip or conda: the refusal names
    // what the user asked for.
    std::vector<std::string> bad;
    for (const auto& [k, x] : it->items()) {
      if (k != f::kEnvVars && k != f::kRayCommit) bad.push_back(k.substr(0, kMaxNameBytes));
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
      v.env_vars = string_map("runtime_env.env_vars", *env, kMaxEnvVars, kMaxEnvBytes,
                              " (every variable is in every rank's environment)");
      check_env_vars(v.env_vars);
    }
  }
  if (auto it = body.find(f::kMetadata); it != body.end() && !it->is_null()) {
    v.metadata = string_map(f::kMetadata, *it, kMaxEnvVars, kMaxMetadataBytes,
                            " (metadata is for a few labels; keep data in files)");
  }
  v.entrypoint_num_cpus = non_negative_number(body, f::kEntrypointNumCpus);
  v.entrypoint_num_gpus = non_negative_number(body, f::kEntrypointNumGpus);
  non_negative_number(body, f::kEntrypointMemory);
  if (auto it = body.find(f::kEntrypointResources); it != body.end() && !it->is_null()) {
    if (!it->is_object()) wrong_type(f::kEntrypointResources, "an object of numbers", *it);
    if (it->size() > kMaxEnvVars) {
      throw MessageTooLargeError(detail::concat("The field 'entrypoint_resources' has ", it->size(),
                                                " entries; the limit is ", kMaxEnvVars, "."));
    }
    for (const auto& [k, x] : it->items()) {
      if (!x.is_number()) wrong_type(std::string(f::kEntrypointResources) + "." + k, "a number", x);
      if (!(std::abs(x.get<double>()) <= kMaxResourceAmount)) {
        throw InvalidArgumentError(detail::concat("The field 'entrypoint_resources.", k,
                                                  "' must be at most ", kMaxResourceAmount, "."));
      }
      check_size(std::string(f::kEntrypointResources) + " key", k.size(), kMaxNameBytes, "");
      v.entrypoint_resources[k] = x.get<double>();
    }
  }
  if (auto it = body.find(f::kTrainyard); it != body.end() && !it->is_null()) {
    if (!it->is_object()) wrong_type(f::kTrainyard, "an object", *it);
    static const std::set<std::string_view> kLaunchFields = {
        f::kNodes,          f::kNprocPerNode,      f::kMaxRestarts,
        f::kRestartBackoff, f::kRestartBackoffMax, f::kHangTimeout};
    for (const auto& [k, x] : it->items()) {
      if (kLaunchFields.count(k) == 0)
        throw InvalidArgumentError(
            "Unknown field 'trainyard." + k.substr(0, kMaxNameBytes) +
            "' in the job submission. Known: nodes, nproc_per_node, max_restarts, "
            "restart_backoff_s, restart_backoff_max_s, hang_timeout_s.");
    }
    v.launch = launch_from(*it, "trainyard.");
    // As --max-restarts takes it (jobs the head stored before this limit still read back).
    if (v.launch.max_restarts > elastic::kMaxRestartsLimit)
      throw InvalidArgumentError(detail::concat("The field 'trainyard.", f::kMaxRestarts,
                                                "' must be at most ", elastic::kMaxRestartsLimit,
                                                "; got ", v.launch.max_restarts, "."));
  }
}

void to_json(json& j, const SubmitAnswer& v) {
  j = json{{f::kJobId, v.job_id}, {f::kSubmissionId, v.submission_id}};
}

void from_json(const json& j, SubmitAnswer& v) {
  const jf::Context c{"submit answer"};
  v.submission_id = jf::required<std::string>(j, c, f::kSubmissionId);
  v.job_id = jf::optional_or<std::string>(j, c, f::kJobId, v.submission_id);
}

void to_json(json& j, const JobDetails& v) {
  json demand = nullptr;
  if (v.demand) demand = {{f::kDemandCpu, v.demand->cpu}, {f::kDemandGpu, v.demand->gpu}};
  json ty = {{f::kAssignedNodes, v.assigned_nodes},
             {f::kFailedRank, optional_json(v.failed_rank)},
             {f::kFailedNode, optional_json(v.failed_node)},
             {f::kLastLines, v.last_lines},
             {f::kDemand, demand},
             {f::kLogsComplete, v.logs_complete}};
  j = json{{f::kType, "SUBMISSION"},
           {f::kJobId, v.job_id},
           {f::kSubmissionId, v.submission_id},
           {f::kDriverInfo, nullptr},
           {f::kStatus, v.status},
           {f::kEntrypoint, v.entrypoint},
           {f::kMessage, v.message},
           {f::kErrorType, optional_json(v.error_type)},
           {f::kStartTime, v.start_time},
           {f::kEndTime, optional_json(v.end_time)},
           {f::kMetadata, v.metadata},
           {f::kRuntimeEnv, v.env_vars.empty() ? json::object() : json{{f::kEnvVars, v.env_vars}}},
           {f::kDriverAgentHttpAddress, nullptr},
           {f::kDriverNodeId, optional_json(v.driver_node_id)},
           {f::kDriverExitCode, optional_json(v.driver_exit_code)},
           {f::kEntrypointNumCpus, optional_json(v.entrypoint_num_cpus)},
           {f::kEntrypointNumGpus, optional_json(v.entrypoint_num_gpus)},
           {f::kEntrypointResources, v.entrypoint_resources},
           {f::kTrainyard, ty}};
  put_launch(j[f::kTrainyard], v.launch);
}

void from_json(const json& j, JobDetails& v) {
  const jf::Context c{"job"};
  v = JobDetails{};
  v.job_id = jf::required<std::string>(j, c, f::kJobId);
  v.submission_id = jf::optional_or<std::string>(j, c, f::kSubmissionId, v.job_id);
  v.status = jf::required<std::string>(j, c, f::kStatus);
  v.entrypoint = jf::optional_or<std::string>(j, c, f::kEntrypoint, "");
  v.message = jf::optional_or<std::string>(j, c, f::kMessage, "");
  v.error_type = jf::optional<std::string>(j, c, f::kErrorType);
  v.start_time = jf::optional_or<std::int64_t>(j, c, f::kStartTime, 0);
  v.end_time = jf::optional<std::int64_t>(j, c, f::kEndTime);
  v.metadata = jf::optional_or<std::map<std::string, std::string>>(j, c, f::kMetadata, {});
  const json env = jf::optional_or<json>(j, c, f::kRuntimeEnv, json::object());
  v.env_vars = jf::optional_or<std::map<std::string, std::string>>(env, {"job's runtime_env"},
                                                                   f::kEnvVars, {});
  v.driver_node_id = jf::optional<std::string>(j, c, f::kDriverNodeId);
  v.driver_exit_code = jf::optional<int>(j, c, f::kDriverExitCode);
  v.entrypoint_num_cpus = jf::optional<double>(j, c, f::kEntrypointNumCpus);
  v.entrypoint_num_gpus = jf::optional<double>(j, c, f::kEntrypointNumGpus);
  v.entrypoint_resources =
      jf::optional_or<std::map<std::string, double>>(j, c, f::kEntrypointResources, {});
  const json ty = jf::optional_or<json>(j, c, f::kTrainyard, json::object());
  const jf::Context t{"job's trainyard"};
  v.launch = launch_from(ty, "trainyard.");
  v.assigned_nodes = jf::optional_list<std::string>(ty, t, f::kAssignedNodes);
  v.failed_rank = jf::optional<int>(ty, t, f::kFailedRank);
  v.failed_node = jf::optional<std::string>(ty, t, f::kFailedNode);
  v.last_lines = jf::optional_list<std::string>(ty, t, f::kLastLines);
  v.logs_complete = jf::optional_or<bool>(ty, t, f::kLogsComplete, true);
  if (const auto d = ty.find(f::kDemand); d != ty.end() && !d->is_null()) {
    const jf::Context dc{"job's demand"};
    v.demand = JobDemand{.cpu = jf::optional_or<double>(*d, dc, f::kDemandCpu, 0),
                         .gpu = jf::optional_or<double>(*d, dc, f::kDemandGpu, 0)};
  }
}

void to_json(json& j, const LogPage& v) {
  j = json{{f::kLogs, v.logs}};
  if (v.next) j[f::kNext] = *v.next;
}

void from_json(const json& j, LogPage& v) {
  v.logs = jf::optional_or<std::string>(j, {"log page"}, f::kLogs, "");
  v.next = jf::optional<std::int64_t>(j, {"log page"}, f::kNext);
}

void to_json(json& j, const StopAnswer& v) {
  j = json{{f::kStopped, v.stopped}};
}

void from_json(const json& j, StopAnswer& v) {
  v.stopped = jf::optional_or<bool>(j, {"stop answer"}, f::kStopped, false);
}

}  // namespace trainyard::cluster::wire
