// Reading a config.json's fields into typed members: a value of the wrong JSON type is refused
// naming the key; an absent key leaves the member's default.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
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

// Which layers of an architecture attend within config.json's sliding window, as transformers
// reads the keys: Mistral's all of them; Qwen2's and Qwen3's only with use_sliding_window, and
// then those "layer_types" names "sliding_attention" or, without it, those from
// "max_window_layers" (default 28) on.
enum class WindowedLayers { kAll, kFromMaxWindowLayers };

// trainyard's attention has no sliding window: refuses a config.json in which some layer attends
// within a window ("sliding_window", transformers' default 4096 when absent; null is none)
// shorter than max_position_embeddings, naming the first such layer. A window as long as any
// sequence the model takes is plain causal attention.
inline void refuse_sliding_window(const Json& j,
                                  WindowedLayers layers,
                                  std::int64_t num_hidden_layers,
                                  std::int64_t max_position_embeddings) {
  bool use_window = layers == WindowedLayers::kAll;
  if (layers == WindowedLayers::kFromMaxWindowLayers)
    read_field(j, "use_sliding_window", use_window);
  if (!use_window) return;
  std::int64_t window = 4096;
  if (j.contains("sliding_window") && j["sliding_window"].is_null()) return;
  read_field(j, "sliding_window", window);
  if (window >= max_position_embeddings) return;
  std::int64_t first = -1;  // the first layer that slides
  std::string why;          // what makes it slide
  if (layers == WindowedLayers::kAll) {
    first = 0;
  } else if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const auto& types = j["layer_types"];
    TY_CHECK(types.is_array(), "config.json: \"layer_types\" must be a list, got ", types.dump(),
             ".");
    for (std::size_t i = 0; i < types.size() && first < 0; ++i)
      if (types[i] == "sliding_attention") first = static_cast<std::int64_t>(i);
    why = " (use_sliding_window true; layer_types names it \"sliding_attention\")";
  } else {
    std::int64_t max_window_layers = 28;
    read_field(j, "max_window_layers", max_window_layers);
    if (max_window_layers < num_hidden_layers) first = std::max<std::int64_t>(max_window_layers, 0);
    why = detail::concat(" (use_sliding_window true, max_window_layers ", max_window_layers, ")");
  }
  if (first < 0) return;
  throw InvalidArgumentError(detail::concat(
      "config.json: \"sliding_window\" is ", window, ", shorter than max_position_embeddings (",
      max_position_embeddings, "), and layer ", first, " attends within it", why,
      "; trainyard's attention is causal over the whole sequence and has no sliding window yet. "
      "HINT: set max_position_embeddings to at most ",
      window, " in a copy of config.json to train on sequences within one window."));
}

}  // namespace trainyard::models
