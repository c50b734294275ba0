// A job as Ray's Jobs API speaks of it: the submit request validated into a JobRecord (400s name
// the field), JobDetails written from one (the token redacted), the "N" / "MIN:MAX" node counts
// and Ray-style submission ids.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

#include "trainyard/cluster/job_store.h"
#include "trainyard/cluster/wire.h"

namespace trainyard::cluster {

// "2" -> {2, 2}, "1:3" -> {1, 3}. InvalidArgumentError naming trainyard.nodes otherwise.
std::pair<int, int> parse_nodes(const std::string& nodes);

// A submit request (POST /api/jobs/, validated by wire::from_json) as a new PENDING JobRecord;
// job_id and submission_id are the request's submission_id, or a new id. InvalidArgumentError
// naming trainyard.nodes when it is not "N" or "MIN:MAX".
JobRecord job_from_submission(const wire::JobSubmission& submission);

// "raysubmit_" + 16 random letters and digits, as Ray makes them.
std::string make_submission_id();

// CPUs and GPUs one node must have free for one of the job's nodes: nproc_per_node ranks of
// entrypoint_num_cpus (default 1) and entrypoint_num_gpus (default 0) each.
double job_cpus_per_node(const JobRecord& job);
double job_gpus_per_node(const JobRecord& job);

// Ray's JobDetails with trainyard's extension. Where the token appears (an env var's value, the
// entrypoint, the message) it is written "<redacted>".
nlohmann::json job_details(const JobRecord& job,
                           const std::optional<std::string>& token,
                           bool logs_complete);

}  // namespace trainyard::cluster
