// Reading the fields of a JSON message with errors that name the message and the field: what
// every from_json of the cluster's messages uses (wire.cpp, status_report.cpp,
// node_resources.cpp). Every error is an InvalidArgumentError; a value is quoted in it shortened
// to kExcerptChars, so a huge or hostile message never becomes a huge error.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "trainyard/error.h"

namespace trainyard::cluster::json_fields {

inline constexpr std::size_t kExcerptChars = 200;

// The JSON text of `v`, cut to kExcerptChars with "..." (bytes that are not UTF-8 replaced).
inline std::string excerpt(const nlohmann::json& v) {
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > kExcerptChars) s = s.substr(0, kExcerptChars) + "...";
  return s;
}

// Where a message sits, for messages: object "node", where " in the cluster snapshot" gives
// "The node in the cluster snapshot has no 'state' field".
struct Context {
  std::string_view object;
  std::string_view where = "";
};

inline const nlohmann::json& field(const nlohmann::json& j, Context c, const char* name) {
  TY_CHECK_T(InvalidArgumentError, j.is_object(), "The ", c.object, c.where,
             " must be a JSON object, not ", excerpt(j), ".");
  const auto it = j.find(name);
  TY_CHECK_T(InvalidArgumentError, it != j.end(), "The ", c.object, c.where, " has no '", name,
             "' field: ", excerpt(j), ".");
  return *it;
}

template <typename T>
T get_as(const nlohmann::json& value, Context c, const char* name) {
  try {
    return value.get<T>();
  } catch (const nlohmann::json::exception&) {
    throw InvalidArgumentError(detail::concat("The ", c.object, "'s '", name, "' field", c.where,
                                              " has the wrong type: ", excerpt(value), "."));
  }
}

template <typename T>
T required(const nlohmann::json& j, Context c, const char* name) {
  return get_as<T>(field(j, c, name), c, name);
}

// The field's value, or nullopt when it is absent or null.
template <typename T>
std::optional<T> optional(const nlohmann::json& j, Context c, const char* name) {
  TY_CHECK_T(InvalidArgumentError, j.is_object(), "The ", c.object, c.where,
             " must be a JSON object, not ", excerpt(j), ".");
  const auto it = j.find(name);
  if (it == j.end() || it->is_null()) return std::nullopt;
  return get_as<T>(*it, c, name);
}

template <typename T>
T optional_or(const nlohmann::json& j, Context c, const char* name, T fallback) {
  return optional<T>(j, c, name).value_or(std::move(fallback));
}

// An array field (absent or null: empty) of at most max_items elements, each converted to T.
template <typename T>
std::vector<T> optional_list(const nlohmann::json& j,
                             Context c,
                             const char* name,
                             std::size_t max_items = SIZE_MAX) {
  TY_CHECK_T(InvalidArgumentError, j.is_object(), "The ", c.object, c.where,
             " must be a JSON object, not ", excerpt(j), ".");
  const auto it = j.find(name);
  if (it == j.end() || it->is_null()) return {};
  TY_CHECK_T(InvalidArgumentError, it->is_array(), "The ", c.object, "'s '", name, "' field",
             c.where, " must be an array, not ", excerpt(*it), ".");
  TY_CHECK_T(InvalidArgumentError, it->size() <= max_items, "The ", c.object, "'s '", name,
             "' field", c.where, " has ", it->size(), " entries; at most ", max_items,
             " are allowed.");
  std::vector<T> items;
  items.reserve(it->size());
  for (const auto& item : *it) items.push_back(item.get<T>());
  return items;
}

}  // namespace trainyard::cluster::json_fields
