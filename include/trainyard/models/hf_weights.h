// Hugging Face model folders for trainyard's models: parameters read from a folder's weights
// (hf::WeightReader: safetensors, sharded safetensors, pytorch_model.bin) by name, into a whole
// module or slice by slice into FSDP's shards, and a module's parameters exported as a folder
// (config.json, model.safetensors or shards with an index), one tensor at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>

namespace trainyard::hf {
class WeightReader;
}

namespace trainyard::models {

class CausalLmConfig;
class CausalLmImpl;

// Throws CheckpointCorruptError unless `reader` holds exactly the tensors named in `model_names`
// (besides the buffers older checkpoints saved that `config`'s architecture recomputes:
// CausalLmConfig::is_unused_checkpoint_tensor): the message names the tensors the model needs and
// the folder lacks, and those the folder holds and the model lacks (a config.json with fewer layers
// than the weights), with a HINT. A silent subset is never loaded.
void check_hf_tensor_names(const CausalLmConfig& config,
                           const std::vector<std::string>& model_names,
                           const hf::WeightReader& reader);

// Copies every parameter of `model` (HF names) from `reader`, converting the
// stored dtype, after check_hf_tensor_names; LoRA adapters (is_lora_parameter) are not the
// folder's and keep their values. Throws CheckpointCorruptError naming the tensor, its
// file and both shapes when a shape disagrees with the model (its config.json), and naming the
// missing and unexpected tensors.
void load_hf_weights(CausalLmImpl& model, const hf::WeightReader& reader);

// An FSDP ParamSliceInit (fsdp/fully_sharded_data_parallel.h) reading the elements a rank's
// shards hold from `reader` and nothing else. `shapes(name)` gives the model's shape of a
// parameter, checked against the file once per parameter. Call check_hf_tensor_names first: a
// slice reader sees one parameter at a time, never the whole set.
std::function<void(const std::string&, std::int64_t, std::int64_t, float*)> hf_slice_init(
    std::shared_ptr<const hf::WeightReader> reader,
    std::function<std::vector<std::int64_t>(const std::string&)> shapes);

struct LoraOptions;

struct ExportOptions {
  std::uint64_t max_shard_bytes = 5'000'000'000;  // save_pretrained's "5GB"
  bool bf16 = false;                              // write BF16 instead of F32
  // Write into a folder that holds files already (--force); otherwise that is an error.
  bool overwrite = false;
  // A LoRA run: write the adapters alone in PEFT's layout (export_lora_adapter) instead of the
  // merged model (--adapter-only).
  bool adapter_only = false;
};

// `module`'s LoRA factors (is_lora_parameter) as Hugging Face PEFT saves an adapter:
// dir/adapter_config.json (peft_type LORA, r, lora_alpha, lora_dropout, target_modules,
// base_model_name_or_path = `base_model`) and dir/adapter_model.safetensors with PEFT's names
// ("base_model.model." + the parameter's name), fp32. Checks the folder as export_hf does.
void export_lora_adapter(const torch::nn::Module& module,
                         const LoraOptions& lora,
                         const std::string& base_model,
                         const std::string& dir,
                         ExportOptions options = {});

// Writes `module`'s parameters to `dir` as Hugging Face weights (model.safetensors, or shards and
// model.safetensors.index.json past max_shard_bytes) and `config_json` as config.json, streaming
// one tensor at a time. Files appear complete or not at all. Throws InvalidArgumentError, writing
// nothing, when `dir` is an existing file, or a folder holding files unless options.overwrite.
void export_hf(const torch::nn::Module& module,
               const std::string& config_json,
               const std::string& dir,
               ExportOptions options = {});
// The same for tensors produced one at a time, in the order of `tensors` (name and shape):
// `fill(name, dst)` writes that tensor's fp32 values, and only one is held at a time.
using TensorShapes = std::vector<std::pair<std::string, std::vector<std::int64_t>>>;
void export_hf(const TensorShapes& tensors,
               const std::function<void(const std::string&, float*)>& fill,
               const std::string& config_json,
               const std::string& dir,
               ExportOptions options = {});

}  // namespace trainyard::models
