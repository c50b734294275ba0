// The registry of a process's counters and gauges.
#include "trainyard/metrics/registry.h"

#include "trainyard/error.h"

namespace trainyard::metrics {

// Note [One registry per process]
// Library code deep in a rank (a collective, a checkpoint save) records what it did without a
// registry handed down through every call: as Prometheus' client libraries do, a process has one
// default registry. It holds plain values, not communicators or sockets, so an agent that forms
// process groups many times shares nothing stateful through it; counters only grow, so a reader
// takes rates from differences whatever else the process did. Tests that need a clean slate
// construct a Registry of their own.
Registry& process_registry() {
  static Registry* registry = new Registry();  // never destroyed: used from exiting threads
  return *registry;
}

Registry::Series& Registry::find_or_add(std::string_view name,
                                        MetricType type,
                                        std::string_view help,
                                        const Labels& labels) {
  std::lock_guard<std::mutex> lock(mutex_);
  FamilyEntry* family = nullptr;
  for (FamilyEntry& f : families_)
    if (f.name == name) family = &f;
  if (family == nullptr) {
    if (!valid_metric_name(name))
      throw InvalidArgumentError(detail::concat("Metric name \"", name, "\" is not valid."));
    family = &families_.emplace_back(FamilyEntry{std::string(name), type, std::string(help), {}});
  } else if (family->type != type) {
    throw InvalidArgumentError(detail::concat("Metric ", name, " is already a ",
                                              type == MetricType::kCounter ? "gauge" : "counter",
                                              "; a name has one type."));
  }
  auto it = family->by_labels.find(labels);
  if (it != family->by_labels.end()) return *it->second;
  for (const auto& l : labels)
    if (!valid_label_name(l.first))
      throw InvalidArgumentError(
          detail::concat("Metric ", name, " has an invalid label name \"", l.first, "\"."));
  Series& series = series_.emplace_back();
  series.labels = labels;
  family->by_labels.emplace(labels, &series);
  return series;
}

Counter& Registry::counter(std::string_view name, std::string_view help, const Labels& labels) {
  return find_or_add(name, MetricType::kCounter, help, labels).counter;
}

Gauge& Registry::gauge(std::string_view name, std::string_view help, const Labels& labels) {
  return find_or_add(name, MetricType::kGauge, help, labels).gauge;
}

Snapshot Registry::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Snapshot out;
  out.reserve(families_.size());
  for (const FamilyEntry& f : families_) {
    Family family{.name = f.name, .type = f.type, .help = f.help, .samples = {}};
    family.samples.reserve(f.by_labels.size());
    for (const auto& [labels, series] : f.by_labels) {
      const double v =
          f.type == MetricType::kCounter ? series->counter.value() : series->gauge.value();
      family.samples.push_back(Sample{.labels = labels, .value = v});
    }
    out.push_back(std::move(family));
  }
  return out;
}

}  // namespace trainyard::metrics
