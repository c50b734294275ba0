// A reading of metrics as plain data: families of labelled samples, the way Prometheus models
// them. Ranks, agents, workers and the head pass Snapshots to each other as JSON and the head and
// agents render them in Prometheus' text exposition format (version 0.0.4).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace trainyard::metrics {

enum class MetricType { kCounter, kGauge };

// Label names and values, in the order they are written. Names match [a-zA-Z_][a-zA-Z0-9_]*
// and never start with "__"; values are any UTF-8.
using Labels = std::vector<std::pair<std::string, std::string>>;

struct Sample {
  Labels labels;
  double value = 0;

  bool operator==(const Sample&) const = default;
};

// One metric: a name with the trainyard_ prefix in base units (_seconds, _bytes, _total for
// counters, _ratio for 0..1), its type and help text, and one sample per label set.
struct Family {
  std::string name;
  MetricType type = MetricType::kGauge;
  std::string help;
  std::vector<Sample> samples;

  bool operator==(const Family&) const = default;
};

using Snapshot = std::vector<Family>;

// [{"name": "...", "type": "counter"|"gauge", "help": "...",
//   "samples": [{"labels": [["op", "all_reduce"]], "value": 1.5}]}]
// Labels are [name, value] pairs, so they keep their order through a round trip; NaN and
// infinities travel as the strings "NaN", "+Inf", "-Inf". from_json throws InvalidArgumentError
// naming the family and field that is malformed (a bad name, an unknown type, a value that is no
// number).
void to_json(nlohmann::json& j, const Snapshot& snapshot);
void from_json(const nlohmann::json& j, Snapshot& snapshot);
std::string snapshot_json(const Snapshot& snapshot);
Snapshot snapshot_from_json(const std::string& text, const std::string& what);

// Puts `labels` before every sample's own labels (the agent adds job and rank, the head adds
// node). A sample that already has one of these labels keeps its own value.
Snapshot with_labels(Snapshot snapshot, const Labels& labels);

// Appends `more`'s samples to the family of the same name in `into` (or appends the family);
// the first family's type and help win. Families stay in first-seen order.
void merge_into(Snapshot& into, Snapshot more);

// The family named `name`, or null.
const Family* find_family(const Snapshot& snapshot, std::string_view name);
// The value of the sample of `name` whose labels include every one of `match`; nullopt-like NaN
// when there is none. For tests and the head's derived series.
double find_value(const Snapshot& snapshot, std::string_view name, const Labels& match = {});

// Prometheus' text format: "# HELP", "# TYPE", then one line per sample, families in order,
// label values escaped (\\, \", \n), values as Prometheus writes them (NaN, +Inf, -Inf).
// Families of the same name must have been merged (merge_into) first; every family's samples
// must have distinct label sets (the caller's contract; not checked).
std::string prometheus_text(const Snapshot& snapshot);
// The Content-Type /metrics answers with.
inline constexpr std::string_view kPrometheusContentType =
    "text/plain; version=0.0.4; charset=utf-8";

bool valid_metric_name(std::string_view name);  // [a-zA-Z_:][a-zA-Z0-9_:]*
bool valid_label_name(std::string_view name);   // [a-zA-Z_][a-zA-Z0-9_]*, not "__..."

}  // namespace trainyard::metrics
