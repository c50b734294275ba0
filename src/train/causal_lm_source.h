// Where a causal-LM run's model and tokenizer come from: a preset, a Hugging Face folder (local,
// file:// or s3://, fetched into a local cache), a tokenizer.json or bytes. Shared by the recipe
// (causal_lm.cpp) and the readers that rebuild a run's model (causal_lm_reader.cpp).
#pragma once

#include <string>

#include "trainyard/models/causal_lm_config.h"
#include "trainyard/train/causal_lm.h"

namespace trainyard::train {

// The model's configuration and, for a Hugging Face folder, the local folder holding it.
struct ModelSource {
  models::CausalLmConfig config;
  std::string dir;  // empty for a preset
};

// Throws InvalidArgumentError unless `model` is a folder, a storage URI or a preset name.
void check_model_flag(const std::string& model);
// The configuration --model names: a preset's, or the config.json of its folder (s3:// folders
// are fetched first: Note [Models on storage]). Errors name the file.
ModelSource resolve_model(const std::string& model);
// Whether `dir` holds weights hf::WeightReader reads.
bool has_hf_weights(const std::string& dir);

// Note [A LoRA checkpoint's base]: every checkpoint of a LoRA run holds this file, the
// fingerprint of the base model its adapters were trained on.
inline constexpr const char* kLoraBaseFile = "lora_base.json";
// The fingerprint (JSON text) of the base `model` (the --model given) resolved to `source`.
std::string base_fingerprint(const std::string& model, const ModelSource& source);
// Throws InvalidArgumentError naming each file that is gone, new or changed when the base as it
// is now (`now`) is not the one `recorded` in checkpoint `where`.
void check_same_base(const std::string& recorded, const std::string& now, const std::string& where);

// Bytes as tokens (ids 0-255).
TextTokenizer byte_tokenizer();
// --tokenizer when given, else the model folder's tokenizer.json, else bytes.
TextTokenizer tokenizer_for(const std::string& tokenizer_flag, const ModelSource& source);

}  // namespace trainyard::train
