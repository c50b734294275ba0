// Snapshots as JSON and as Prometheus' text exposition format.
#include "trainyard/metrics/snapshot.h"

#include <nlohmann/json.hpp>

#include <charconv>
#include <cmath>
#include <limits>

#include "trainyard/error.h"

namespace trainyard::metrics {
namespace {

const char* type_name(MetricType type) {
  return type == MetricType::kCounter ? "counter" : "gauge";
}

bool has_label(const Labels& labels, const std::string& name) {
  for (const auto& [k, v] : labels)
    if (k == name) return true;
  return false;
}

// Prometheus' float format: shortest round-trip digits, NaN, +Inf, -Inf.
void append_value(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "NaN";
  } else if (std::isinf(v)) {
    out += v > 0 ? "+Inf" : "-Inf";
  } else {
    char buf[64];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, end);
  }
}

void append_escaped(std::string& out, std::string_view text, bool quote) {
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

}  // namespace

bool valid_metric_name(std::string_view name) {
  if (name.empty()) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool valid_label_name(std::string_view name) {
  if (name.empty() || name.starts_with("__")) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

void to_json(nlohmann::json& j, const Snapshot& snapshot) {
  j = nlohmann::json::array();
  for (const Family& f : snapshot) {
    auto samples = nlohmann::json::array();
    for (const Sample& s : f.samples) {
      // An array of pairs keeps the labels' order (a JSON object would not).
      auto labels = nlohmann::json::array();
      for (const auto& [k, v] : s.labels) labels.push_back({k, v});
      // JSON has no NaN or infinity: they travel as strings.
      nlohmann::json value = s.value;
      if (!std::isfinite(s.value)) {
        std::string text;
        append_value(text, s.value);
        value = text;
      }
      samples.push_back({{"labels", std::move(labels)}, {"value", std::move(value)}});
    }
    j.push_back({{"name", f.name},
                 {"type", type_name(f.type)},
                 {"help", f.help},
                 {"samples", std::move(samples)}});
  }
}

void from_json(const nlohmann::json& j, Snapshot& snapshot) {
  if (!j.is_array())
    throw InvalidArgumentError("A metrics snapshot must be a JSON array of families.");
  snapshot.clear();
  for (const auto& jf : j) {
    Family f;
    if (!jf.is_object() || !jf.contains("name") || !jf["name"].is_string())
      throw InvalidArgumentError("A metrics family needs a string \"name\".");
    f.name = jf["name"].get<std::string>();
    if (!valid_metric_name(f.name))
      throw InvalidArgumentError(detail::concat("Metric name \"", f.name, "\" is not valid."));
    const std::string type = jf.value("type", "");
    if (type == "counter") {
      f.type = MetricType::kCounter;
    } else if (type == "gauge") {
      f.type = MetricType::kGauge;
    } else {
      throw InvalidArgumentError(detail::concat("Metric ", f.name, " has type \"", type,
                                                "\"; expected \"counter\" or \"gauge\"."));
    }
    if (jf.contains("help") && jf["help"].is_string()) f.help = jf["help"].get<std::string>();
    if (!jf.contains("samples") || !jf["samples"].is_array())
      throw InvalidArgumentError(detail::concat("Metric ", f.name, " has no \"samples\" array."));
    for (const auto& js : jf["samples"]) {
      Sample s;
      if (js.contains("labels")) {
        for (const auto& pair : js["labels"]) {
          if (!pair.is_array() || pair.size() != 2 || !pair[0].is_string() || !pair[1].is_string())
            throw InvalidArgumentError(detail::concat(
                "Metric ", f.name, " has a label that is not a [name, value] pair of strings."));
          std::string k = pair[0].get<std::string>();
          if (!valid_label_name(k))
            throw InvalidArgumentError(
                detail::concat("Metric ", f.name, " has an invalid label name \"", k, "\"."));
          if (has_label(s.labels, k))
            throw InvalidArgumentError(
                detail::concat("Metric ", f.name, " has the label \"", k, "\" twice."));
          s.labels.emplace_back(std::move(k), pair[1].get<std::string>());
        }
      }
      const auto& v = js.contains("value") ? js["value"] : nlohmann::json();
      if (v.is_number()) {
        s.value = v.get<double>();
      } else if (v.is_string() && v.get<std::string>() == "NaN") {
        s.value = std::numeric_limits<double>::quiet_NaN();
      } else if (v.is_string() && v.get<std::string>() == "+Inf") {
        s.value = std::numeric_limits<double>::infinity();
      } else if (v.is_string() && v.get<std::string>() == "-Inf") {
        s.value = -std::numeric_limits<double>::infinity();
      } else {
        throw InvalidArgumentError(
            detail::concat("Metric ", f.name, " has a sample whose value is not a number."));
      }
      f.samples.push_back(std::move(s));
    }
    snapshot.push_back(std::move(f));
  }
}

std::string snapshot_json(const Snapshot& snapshot) {
  nlohmann::json j;
  to_json(j, snapshot);
  return j.dump();
}

Snapshot snapshot_from_json(const std::string& text, const std::string& what) {
  Snapshot s;
  try {
    from_json(nlohmann::json::parse(text), s);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgumentError(
        detail::concat("The metrics in ", what, " are not valid JSON: ", e.what()));
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(
        detail::concat("The metrics in ", what, " are malformed: ", e.what()));
  }
  return s;
}

Snapshot with_labels(Snapshot snapshot, const Labels& labels) {
  for (Family& f : snapshot) {
    for (Sample& s : f.samples) {
      Labels merged;
      merged.reserve(labels.size() + s.labels.size());
      for (const auto& l : labels)
        if (!has_label(s.labels, l.first)) merged.push_back(l);
      for (auto& l : s.labels) merged.push_back(std::move(l));
      s.labels = std::move(merged);
    }
  }
  return snapshot;
}

void merge_into(Snapshot& into, Snapshot more) {
  for (Family& f : more) {
    Family* same = nullptr;
    for (Family& g : into)
      if (g.name == f.name) same = &g;
    if (same == nullptr) {
      into.push_back(std::move(f));
    } else {
      for (Sample& s : f.samples) same->samples.push_back(std::move(s));
    }
  }
}

const Family* find_family(const Snapshot& snapshot, std::string_view name) {
  for (const Family& f : snapshot)
    if (f.name == name) return &f;
  return nullptr;
}

double find_value(const Snapshot& snapshot, std::string_view name, const Labels& match) {
  if (const Family* f = find_family(snapshot, name)) {
    for (const Sample& s : f->samples) {
      bool all = true;
      for (const auto& m : match) {
        bool found = false;
        for (const auto& l : s.labels) found = found || l == m;
        all = all && found;
      }
      if (all) return s.value;
    }
  }
  return std::numeric_limits<double>::quiet_NaN();
}

std::string prometheus_text(const Snapshot& snapshot) {
  std::string out;
  out.reserve(snapshot.size() * 160);
  for (const Family& f : snapshot) {
    out += "# HELP ";
    out += f.name;
    out += ' ';
    append_escaped(out, f.help, /*quote=*/false);
    out += "\n# TYPE ";
    out += f.name;
    out += ' ';
    out += type_name(f.type);
    out += '\n';
    for (const Sample& s : f.samples) {
      out += f.name;
      if (!s.labels.empty()) {
        out += '{';
        bool first = true;
        for (const auto& [k, v] : s.labels) {
          if (!first) out += ',';
          first = false;
          out += k;
          out += "=\"";
          append_escaped(out, v, /*quote=*/true);
          out += '"';
        }
        out += '}';
      }
      out += ' ';
      append_value(out, s.value);
      out += '\n';
    }
  }
  return out;
}

}  // namespace trainyard::metrics
