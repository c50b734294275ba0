// The seam between trainyard's causal language models and what runs them (the causal-lm recipe,
// FSDP's wrapping, generation, export): CausalLmImpl, which GPT-NeoX implements, and
// make_causal_lm, which builds the architecture a CausalLmConfig names. Code above models/
// holds a CausalLm and never names an architecture.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trainyard/ignore_index.h"
#include "trainyard/models/causal_lm_config.h"
#include "trainyard/models/lora.h"

namespace trainyard::models {

// How a model's parameters come to exist.
struct CausalLmInit {
  // torch::kMeta creates shapes only (no storage, no initialisation); any other device gets
  // initialised fp32 parameters.
  torch::Device device = torch::kCPU;
  std::uint64_t seed = 0;  // see Note [Per-name initialisation]
  // CPU parameters with their shapes but no memory (zero-byte storage) and no values: for
  // FullyShardedDataParallel, which allocates and initialises one unit at a time through
  // FsdpOptions::param_init (CausalLmImpl::init_parameter), so the full model never exists in one
  // process. Such a model cannot run until FSDP has taken it.
  bool deferred = false;
  // LoRA adapters on the linear layers lora->targets names, every other parameter frozen
  // (models/lora.h); nullopt: none, every parameter trainable.
  std::optional<LoraOptions> lora;
};

// Note [Per-name initialisation]
// Every parameter is initialised from its own CPU generator seeded with a hash of (seed, full
// parameter name), never from the global generator. So a tensor's values depend only on its name,
// the seed and the config: not on what else was built, in which order, on which rank, or whether
// it was materialised from the meta device later by init_parameter. The values are drawn in fp32
// on the CPU and copied into the tensor (rounded for other dtypes).

// The keys and values of the positions a model has seen, per layer, so that decoding feeds one
// new token at a time (CausalLmImpl::forward_cached). Starts empty.
struct KvCache {
  struct Layer {
    torch::Tensor key, value;  // (B, kv_heads, T_past, head_size); undefined while empty
  };
  std::vector<Layer> layers;
  std::int64_t length() const {  // positions cached
    return layers.empty() || !layers[0].key.defined() ? 0 : layers[0].key.size(2);
  }
};

class CausalLmImpl : public torch::nn::Module {
 public:
  // (B, T) int64 token ids, T <= max_position_embeddings -> (B, T, vocab_size) logits, in the
  // parameters' dtype. Calls its embeddings, layers and head through trainyard::nn::call_unit.
  virtual torch::Tensor forward(const torch::Tensor& input_ids) = 0;
  // For decoding (an unwrapped model, no autograd needed): the logits of positions
  // [cache.length(), cache.length() + T) given the cached ones, in fp32; appends to `cache`. Equal
  // to the last T positions of forward() over the whole sequence.
  virtual torch::Tensor forward_cached(const torch::Tensor& input_ids, KvCache& cache) = 0;
  // Hugging Face's causal-LM loss of forward(input_ids) against labels (B, T): causal_lm_loss.
  torch::Tensor loss(const torch::Tensor& input_ids, const torch::Tensor& labels);

  // Fills `tensor` (any device and floating dtype, shaped as the parameter) with the initial value
  // of the parameter `full_name` (as named_parameters() names it) under this model's seed, exactly
  // as construction does (Note [Per-name initialisation]). Throws InvalidArgumentError for a name
  // that is not one of the model's parameters. FSDP materialises deferred models through it.
  virtual void init_parameter(const std::string& full_name, torch::Tensor& tensor) const = 0;

  // The transformer layer, the unit FSDP wraps once per layer (and activation checkpointing
  // recomputes): whether `module` is one.
  virtual bool is_layer(const torch::nn::Module& module) const = 0;
  // Qualified names of the other modules that become FSDP units of their own (the embeddings).
  virtual std::vector<std::string> unit_names() const = 0;

  const CausalLmConfig& lm_config() const { return lm_config_; }
  std::uint64_t seed() const { return seed_; }
  // The LoRA adapters it was built with (CausalLmInit::lora).
  const std::optional<LoraOptions>& lora() const { return lora_; }

 protected:
  CausalLmImpl(CausalLmConfig config, std::uint64_t seed)
      : lm_config_(std::move(config)), seed_(seed) {}
  // For the architectures' constructors: adapters on the targeted linear layers of every
  // transformer layer (while parameters are being built, so deferred ones stay deferred), and
  // then, once initialised, every other parameter frozen.
  void add_lora(const LoraOptions& lora, const torch::TensorOptions& options);
  // The end of every architecture's constructor: initialises each parameter (init_parameter)
  // unless `init` is on the meta device or deferred, then freezes all but LoRA's when it has them.
  void initialise(const CausalLmInit& init);

 private:
  CausalLmConfig lm_config_;
  std::uint64_t seed_;
  std::optional<LoraOptions> lora_;
};

// Whether `name` is a LoRA factor: "...lora_A.weight" or "...lora_B.weight".
bool is_lora_parameter(std::string_view name);

// The model's parameters without its LoRA factors, each adapted weight merged:
// W + (alpha / r) B A, in fp32 (copies). The model as a plain one, for export.
std::vector<std::pair<std::string, torch::Tensor>> merged_lora_parameters(
    const CausalLmImpl& model);

// A shared handle to any causal LM, as TORCH_MODULE gives one (model->forward(...)).
class CausalLm : public torch::nn::ModuleHolder<CausalLmImpl> {
 public:
  using torch::nn::ModuleHolder<CausalLmImpl>::ModuleHolder;
  CausalLm(std::nullptr_t) : ModuleHolder(nullptr) {}  // NOLINT: implicit, as TORCH_MODULE's
  CausalLm(std::shared_ptr<CausalLmImpl> impl)         // NOLINT: implicit
      : ModuleHolder(std::move(impl)) {}
};

// The model `config` describes (GptNeoX, ...), built as `init` says. Validates the config.
CausalLm make_causal_lm(const CausalLmConfig& config, CausalLmInit init = {});

using ::trainyard::kIgnoreIndex;  // the label causal_lm_loss leaves out (trainyard/ignore_index.h)

// Hugging Face's causal-LM loss: mean cross entropy (in fp32) of logits[:, :-1] (B, T, V) against
// labels[:, 1:] (B, T) int64; labels equal to kIgnoreIndex (-100) are left out of the mean.
torch::Tensor causal_lm_loss(const torch::Tensor& logits, const torch::Tensor& labels);

}  // namespace trainyard::models
