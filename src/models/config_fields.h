// Reading a config.json's fields into typed members: a value of the wrong JSON type is refused
// naming the key; an absent key leaves the member's default.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "trainyard/error.h"

namespace trainyard::models {

using Json = nlohmann::json;

// `json_text` parsed; InvalidArgumentError unless it is valid JSON holding an object.
inline Json parse_config_object(const std::string& json_text) {
  Json j;
  try {
    j = Json::parse(json_text);
  } catch (const Json::parse_error& e) {
    throw InvalidArgumentError(detail::concat("config.json is not valid JSON: ", e.what()));
  }
  TY_CHECK(j.is_object(), "config.json must hold a JSON object, got ", j.type_name(), ".");
  return j;
}

// An architecture's presets: the named configs, their lookup and their names.
template <typename Config>
struct NamedPreset {
  const char* name;
  Config config;
};

// InvalidArgumentError naming the architecture and the known presets when `name` is none.
template <typename Config>
Config find_preset(const std::vector<NamedPreset<Config>>& all,
                   const std::string& name,
                   std::string_view architecture) {
  for (const auto& p : all)
    if (name == p.name) return p.config;
  std::string known;
  for (const auto& p : all) known += (known.empty() ? "" : ", ") + std::string(p.name);
  throw InvalidArgumentError(detail::concat("Unknown ", architecture, " preset \"", name,
                                            "\"; known presets: ", known, "."));
}

template <typename Config>
std::vector<std::string> names_of(const std::vector<NamedPreset<Config>>& all) {
  std::vector<std::string> names;
  for (const auto& p : all) names.emplace_back(p.name);
  return names;
}

// Reads `key` into `out` when present; refuses a value of the wrong JSON type.
inline void read_field(const Json& j, const char* key, std::int64_t& out) {
  auto it = j.find(key);
  if (it == j.end()) return;
  TY_CHECK(it->is_number_integer(), "config.json: \"", key, "\" must be an integer, got ",
           it->dump(), ".");
  out = it->get<std::int64_t>();
}

inline void read_field(const Json& j, const char* key, double& out) {
  auto it = j.find(key);
  if (it == j.end()) return;
  TY_CHECK(it->is_number(), "config.json: \"", key, "\" must be a number, got ", it->dump(), ".");
  out = it->get<double>();
}

inline void read_field(const Json& j, const char* key, bool& out) {
  auto it = j.find(key);
  if (it == j.end()) return;
  TY_CHECK(it->is_boolean(), "config.json: \"", key, "\" must be true or false, got ", it->dump(),
           ".");
  out = it->get<bool>();
}

}  // namespace trainyard::models
