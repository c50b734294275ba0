#include "trainyard/models/causal_lm_config.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "models/config_fields.h"
#include "trainyard/error.h"

namespace trainyard::models {
namespace {

template <typename F>
decltype(auto) visit(const CausalLmConfig::Variant& v, F&& f) {
  return std::visit(std::forward<F>(f), v);
}

// Calls `f(Config{})` for each architecture, in order, until it returns true.
template <typename F>
bool for_each_architecture(F&& f) {
  return [&]<typename... Config>(std::variant<Config...>*) {
    return (f(Config{}) || ...);
  }(static_cast<CausalLmConfig::Variant*>(nullptr));
}

std::string supported_model_types() {
  std::string out;
  for_each_architecture([&](auto config) {
    for (auto type : decltype(config)::kModelTypes)
      out += detail::concat(out.empty() ? "\"" : ", \"", type, "\"");
    return false;
  });
  return out;
}

}  // namespace

CausalLmConfig CausalLmConfig::preset(const std::string& name) {
  std::optional<CausalLmConfig> found;
  for_each_architecture([&](auto config) {
    using Config = decltype(config);
    const auto names = Config::preset_names();
    if (std::find(names.begin(), names.end(), name) == names.end()) return false;
    found = CausalLmConfig(Config::preset(name));
    return true;
  });
  if (found) return *found;
  std::string known;
  for (const auto& p : preset_names()) known += (known.empty() ? "" : ", ") + p;
  throw InvalidArgumentError(
      detail::concat("Unknown model preset \"", name, "\"; known presets: ", known, "."));
}

std::vector<std::string> CausalLmConfig::preset_names() {
  std::vector<std::string> names;
  for_each_architecture([&](auto config) {
    for (auto& n : decltype(config)::preset_names()) names.push_back(n);
    return false;
  });
  return names;
}

bool CausalLmConfig::is_preset(const std::string& name) {
  const auto names = preset_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

CausalLmConfig CausalLmConfig::from_json(const std::string& json_text) {
  const auto j = parse_config_object(json_text);
  // Without model_type: GPT-NeoX, which trainyard read before it knew other architectures.
  std::string type = "gpt_neox";
  if (j.contains("model_type")) {
    TY_CHECK(j["model_type"].is_string(), "config.json: \"model_type\" must be a string, got ",
             j["model_type"].dump(), ".");
    type = j["model_type"].get<std::string>();
  }
  std::optional<CausalLmConfig> found;
  for_each_architecture([&](auto config) {
    using Config = decltype(config);
    const auto& types = Config::kModelTypes;
    if (std::find(std::begin(types), std::end(types), type) == std::end(types)) return false;
    found = CausalLmConfig(Config::from_json(j));
    return true;
  });
  TY_CHECK(found.has_value(), "config.json: \"model_type\" is \"", type, "\"; trainyard builds ",
           supported_model_types(),
           " models. HINT: a model of another architecture cannot be trained here yet.");
  return *found;
}

std::string CausalLmConfig::to_json() const {
  return visit(config_, [](const auto& c) { return c.to_json(); });
}

void CausalLmConfig::validate() const {
  visit(config_, [](const auto& c) { c.validate(); });
}

std::string_view CausalLmConfig::model_type() const {
  return visit(config_, [](const auto& c) -> std::string_view { return c.model_type(); });
}

std::string_view CausalLmConfig::architecture() const {
  return visit(config_, [](const auto& c) -> std::string_view {
    return std::decay_t<decltype(c)>::kArchitecture;
  });
}

std::int64_t CausalLmConfig::vocab_size() const {
  return visit(config_, [](const auto& c) { return c.vocab_size; });
}
std::int64_t CausalLmConfig::hidden_size() const {
  return visit(config_, [](const auto& c) { return c.hidden_size; });
}
std::int64_t CausalLmConfig::num_hidden_layers() const {
  return visit(config_, [](const auto& c) { return c.num_hidden_layers; });
}
std::int64_t CausalLmConfig::intermediate_size() const {
  return visit(config_, [](const auto& c) { return c.intermediate_size; });
}
std::int64_t CausalLmConfig::num_attention_heads() const {
  return visit(config_, [](const auto& c) { return c.num_attention_heads; });
}
std::int64_t CausalLmConfig::max_position_embeddings() const {
  return visit(config_, [](const auto& c) { return c.max_position_embeddings; });
}
std::int64_t CausalLmConfig::parameter_count() const {
  return parameter_layout().total();
}

ParameterLayout CausalLmConfig::parameter_layout() const {
  return visit(config_, [](const auto& c) { return c.parameter_layout(); });
}
std::vector<LayerLinear> CausalLmConfig::layer_linears() const {
  return visit(config_, [](const auto& c) { return c.layer_linears(); });
}
bool CausalLmConfig::is_unused_checkpoint_tensor(std::string_view name) const {
  return visit(config_, [&](const auto& c) { return c.is_unused_checkpoint_tensor(name); });
}
double CausalLmConfig::layer_activation_bytes(const ActivationShape& shape) const {
  return visit(config_, [&](const auto& c) { return c.layer_activation_bytes(shape); });
}

std::int64_t ParameterLayout::layer_elements() const {
  std::int64_t n = 0;
  for (auto e : layer) n += e;
  return n;
}

std::int64_t ParameterLayout::total() const {
  std::int64_t n = embedding + num_layers * layer_elements() + (tied ? 0 : embedding);
  for (auto e : final_norm) n += e;
  return n;
}

}  // namespace trainyard::models
