#include "trainyard/train/result.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>

#include "trainyard/error.h"
#include "trainyard/storage/storage.h"

namespace trainyard::train {

double Result::metric(const std::string& key) const {
  for (const auto& m : metrics)
    if (m.key == key) return m.value;
  throw InvalidArgumentError(detail::concat("The result has no metric \"", key, "\"."));
}

std::string result_json(const Result& r) {
  nlohmann::ordered_json out;
  for (const auto& m : r.metrics) {
    if (m.decimals == 0)
      out[m.key] = static_cast<std::int64_t>(std::llround(m.value));
    else
      out[m.key] = m.value;
  }
  out["checkpoint_dir_name"] = r.checkpoint_dir_name;
  out["time_this_iter_s"] = r.time_this_iter_s;
  out["time_total_s"] = r.time_total_s;
  out["training_iteration"] = r.training_iteration;
  auto& table = out["table"] = nlohmann::ordered_json::array();
  for (const auto& m : r.metrics)
    if (m.in_table) table.push_back({{"key", m.key}, {"decimals", m.decimals}});
  out["config"] = nlohmann::ordered_json::parse(r.config_json);
  return out.dump(2) + "\n";
}

void print_training_result(const std::string& run_uri) {
  const auto text = storage::open_storage(run_uri)->read("result.json");
  const auto path = storage::join_uri(run_uri, "result.json");
  TY_CHECK_T(Error, text.has_value(), "No result at ", path,
             ": the job did not finish. HINT: the ranks' output above names the cause.");
  nlohmann::json r;
  std::vector<std::pair<std::string, std::string>> rows;
  auto fixed = [](double v, int decimals) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
    return std::string(buf);
  };
  try {
    r = nlohmann::json::parse(*text);
    rows = {{"checkpoint_dir_name", r.value("checkpoint_dir_name", "")},
            {"time_this_iter_s", fixed(r.value("time_this_iter_s", 0.0), 3)},
            {"time_total_s", fixed(r.value("time_total_s", 0.0), 3)},
            {"training_iteration", std::to_string(r.value("training_iteration", 0))}};
    for (const auto& row : r.value("table", nlohmann::json::array())) {
      const auto key = row.at("key").get<std::string>();
      const int decimals = row.at("decimals").get<int>();
      const auto& value = r.at(key);
      // A metric with no value (NaN, written as null: no step ran in the attempt) shows as "-".
      rows.emplace_back(key, value.is_null() ? std::string("-")
                             : decimals == 0 ? std::to_string(value.get<std::int64_t>())
                                             : fixed(value.get<double>(), decimals));
    }
  } catch (const std::exception& e) {
    throw CorruptDataError(detail::concat(path, " is not a valid result: ", e.what()));
  }
  std::size_t value_width = 9;
  for (const auto& [key, value] : rows) value_width = std::max(value_width, value.size());
  const std::size_t inner = 2 + 21 + 1 + value_width;  // the box's width inside its borders
  std::string rule;
  for (std::size_t i = 0; i < inner; ++i) rule += "─";
  std::printf("╭%s╮\n│ %-*s│\n├%s┤\n", rule.c_str(), static_cast<int>(inner - 1), "Training result",
              rule.c_str());
  for (const auto& [key, value] : rows)
    std::printf("│ %-21s %*s │\n", key.c_str(), static_cast<int>(value_width), value.c_str());
  std::printf("╰%s╯\n", rule.c_str());
  std::fflush(stdout);
}

}  // namespace trainyard::train
