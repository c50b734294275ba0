// Reading a config.json's fields into typed members: a value of the wrong JSON type is refused
// naming the key; an absent key leaves the member's default.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>

#include "trainyard/error.h"

namespace trainyard::models {

using Json = nlohmann::json;

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
