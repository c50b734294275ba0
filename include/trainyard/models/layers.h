// The building blocks of trainyard's transformers: Dense, LayerNorm, RmsNorm and Embedding.
// LibTorch's Linear, LayerNorm and Embedding allocate and initialise in their constructors; these
// register `weight` / `bias` with torch::empty(shape, options) instead and leave initialisation to
// the model that owns them (a meta-device model allocates nothing; a deferred one gets
// zero-byte parameters, see DeferredParameters).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>

namespace trainyard::models {

// While one lives on a thread, the building blocks built on that thread create CPU parameters
// with their shapes and no memory (CausalLmInit::deferred). Thread-local, so models built on
// other threads at the same time are unaffected. Not nestable.
class DeferredParameters {
 public:
  explicit DeferredParameters(bool enabled);
  ~DeferredParameters();
  DeferredParameters(const DeferredParameters&) = delete;
  DeferredParameters& operator=(const DeferredParameters&) = delete;
};

// One factor of a LoRA adapter (models/lora.h): a weight without bias, named as PEFT names it
// (q_proj.lora_A.weight).
class LowRankImpl : public torch::nn::Module {
 public:
  LowRankImpl(std::int64_t in_features,
              std::int64_t out_features,
              const torch::TensorOptions& options);

  torch::Tensor weight;  // (out_features, in_features)
};
TORCH_MODULE(LowRank);

// y = x W^T + b, W (out_features, in_features); with a LoRA adapter (add_lora) plus
// scaling * B A dropout(x).
class DenseImpl : public torch::nn::Module {
 public:
  DenseImpl(std::int64_t in_features,
            std::int64_t out_features,
            bool bias,
            const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x);
  // Registers lora_A (r, in) and lora_B (out, r), uninitialised (the model initialises them).
  void add_lora(std::int64_t r,
                double scaling,
                double dropout,
                const torch::TensorOptions& options);

  torch::Tensor weight;                      // (out_features, in_features)
  torch::Tensor bias;                        // (out_features), or undefined
  LowRank lora_A{nullptr}, lora_B{nullptr};  // null without an adapter

 private:
  double lora_scaling_ = 0, lora_dropout_ = 0;
};
TORCH_MODULE(Dense);

// torch::layer_norm over the last dimension; computes in the input's dtype as torch does.
class LayerNormImpl : public torch::nn::Module {
 public:
  LayerNormImpl(std::int64_t features, double eps, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight;  // (features)
  torch::Tensor bias;    // (features)
  double eps;
};
TORCH_MODULE(LayerNorm);

// Root-mean-square norm (Zhang & Sennrich 2019) as Hugging Face's LlamaRMSNorm computes it: in
// fp32, x * rsqrt(mean(x^2) + eps), cast back to x's dtype, then times weight.
class RmsNormImpl : public torch::nn::Module {
 public:
  RmsNormImpl(std::int64_t features, double eps, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight;  // (features)
  double eps;
};
TORCH_MODULE(RmsNorm);

// A lookup table: (...) int64 ids -> (..., dim).
class EmbeddingImpl : public torch::nn::Module {
 public:
  EmbeddingImpl(std::int64_t count, std::int64_t dim, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& ids);

  torch::Tensor weight;  // (count, dim)
};
TORCH_MODULE(Embedding);

}  // namespace trainyard::models
