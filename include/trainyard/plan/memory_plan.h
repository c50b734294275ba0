// The memory planner behind `trainyard plan`: per-device bytes of parameters, gradients,
// optimizer state and activations under DDP, ZeRO-1, SHARD_GRAD_OP, FULL_SHARD and HYBRID_SHARD,
// two ways: as the ZeRO paper counts model states (Rajbhandari et al. 2020, section 3.1), and as
// trainyard's engine holds them at its peak (Note [What the engine holds] in memory_plan.cpp).
// LibTorch-free: it needs only a model configuration (GPT-NeoX, Llama) or a parameter count.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "trainyard/models/causal_lm_config.h"
#include "trainyard/models/lora.h"
#include "trainyard/precision.h"
#include "trainyard/strategy.h"

namespace trainyard::plan {

// The strategies the planner models: the rows of a plan, in order of growing communication per
// step, then FSDP's NO_SHARD (DDP's memory through FSDP's engine: planned on request, to compare
// with train_gpt_fsdp --strategy no_shard).
inline constexpr Strategy kPlannedStrategies[] = {Strategy::kDdp,         Strategy::kZero1,
                                                  Strategy::kShardGradOp, Strategy::kHybridShard,
                                                  Strategy::kFullShard,   Strategy::kNoShard};

// Bytes per parameter of each model state (the ZeRO paper's 2 + 2 + K for mixed-precision Adam).
struct StateBytes {
  double params = 0;     // the copy forward and backward read
  double grads = 0;      // the gradients the optimizer reads
  double optimizer = 0;  // K: fp32 master weights (mixed precision only) and Adam's two moments
};
StateBytes zero_paper_state_bytes(Precision precision);  // {2, 2, 12} or {4, 4, 8}

struct PlanOptions {
  // The model: its config (activations, unit sizes), or only a parameter count (model states
  // only: activations need the shape). parameter_count 0 takes the config's.
  std::optional<models::CausalLmConfig> model;
  std::int64_t parameter_count = 0;
  Precision precision = Precision::kBf16Mixed;
  int world_size = 1;     // ranks (devices) in the job
  int gpus_per_node = 0;  // HYBRID_SHARD's shard group; 0: the whole world (one node)
  std::int64_t seq_len = 2048;
  std::int64_t micro_batch = 1;  // sequences per rank per forward
  bool activation_checkpointing = false;
  std::int64_t device_memory_bytes = 0;  // per device; 0: no verdict on fitting
  // Share of the device kept free for the allocator's fragmentation, the communication library
  // and kernels' workspaces: a plan fits when total <= (1 - headroom) x device memory.
  double headroom = 0.10;
  // Per-process bytes outside the model: the program, LibTorch and its allocator, the token
  // buffer. Note [Runtime overhead].
  std::int64_t runtime_bytes = 0;
  // The devices are CPU ranks of trainyard's engine on one machine: plan their peak RSS, which
  // counts the caching allocator's pools and the node's shared gradient buckets (Note [CPU
  // ranks] in src/plan/memory_plan.cpp).
  bool cpu_ranks = false;
  // LoRA fine-tuning (models/lora.h): format_plan adds the adapters' count and the model states
  // of a frozen base (Note [LoRA model states]); needs `model`.
  std::optional<models::LoraOptions> lora;

  // Throws InvalidArgumentError naming the field (and the command-line flag) that is wrong.
  void validate() const;
};

// Measured here for train_gpt_fsdp's ranks (pythia-70m, 2 ranks): see Note [Runtime overhead] in
// src/plan/memory_plan.cpp.
constexpr std::int64_t kCpuRuntimeBytes = std::int64_t{380} << 20;

// One strategy's bytes per device. The engine's figures are at the step's peak; `persistent` is
// what stays between steps (the model states the example program prints as "model state").
struct StrategyPlan {
  Strategy strategy = Strategy::kDdp;
  // As the ZeRO paper counts them: model states only, 2 + 2 + K bytes per parameter divided as
  // the strategy shards them.
  double paper_params = 0, paper_grads = 0, paper_optimizer = 0;
  double paper_total() const { return paper_params + paper_grads + paper_optimizer; }
  // As trainyard's engine holds them at the step's peak: resident state plus the gathered
  // parameters, flat gradients and reductions in flight at that moment (with cpu_ranks: the
  // allocator's pools at their own peaks, and the node's shared DDP buckets).
  double params = 0, grads = 0, optimizer = 0;
  double activations = 0;  // saved activations and the loss's logits at the peak; 0 without a
                           // config
  double runtime = 0;      // PlanOptions::runtime_bytes
  double persistent = 0;   // resident between steps: parameters, gradients, optimizer state
  double total() const { return params + grads + optimizer + activations + runtime; }
  bool fits = false;  // total <= (1 - headroom) x device memory (false without a device size)
  // Where the engine peaks: "loss backward", "head backward" or "layer backward"; "pools (CPU
  // ranks)" with cpu_ranks; "-" without the model's shape.
  std::string peak_phase;
};

struct MemoryPlan {
  PlanOptions options;
  std::int64_t parameter_count = 0;
  std::vector<StrategyPlan> rows;  // DDP, ZeRO-1, SHARD_GRAD_OP, HYBRID_SHARD, FULL_SHARD
  // The first row (least communication) whose engine total fits, HYBRID_SHARD skipped on one
  // node (where it is FULL_SHARD); nullopt when none fits or there is no device size.
  std::optional<Strategy> recommended;
};

// Plans every strategy. Validates the options first.
MemoryPlan plan_memory(const PlanOptions& options);
// One strategy's row, for any of plan::kPlannedStrategies. Validates the options first.
StrategyPlan plan_strategy(const PlanOptions& options, Strategy strategy);

// Activation bytes a rank holds at the loss's backward (its peak for small models), and the
// pieces: see Note [GPT-NeoX activations] and Note [Llama activations].
struct ActivationBytes {
  double per_layer = 0;  // one layer's saved tensors (all of them, even with checkpointing)
  double layers = 0;     // what all layers keep: per_layer x layers, or their inputs only
  double recompute = 0;  // checkpointing: one layer recomputed in backward; else 0
  double head = 0;       // final norm output and the logits, which the caller holds
  double loss_peak = 0;  // the loss's fp32 temporaries at its backward (3 x B x (T-1) x V x 4)
};
ActivationBytes activation_bytes(const models::CausalLmConfig& config,
                                 std::int64_t seq_len,
                                 std::int64_t micro_batch,
                                 Precision precision,
                                 bool activation_checkpointing);

// The plan as text: the engine's table, the ZeRO paper's, the verdict and a recommendation.
// Sizes in GiB (2^30 bytes) or, with `decimal`, GB (1e9 bytes); the header says which.
std::string format_plan(const MemoryPlan& plan, bool decimal = false);

// The model --model names: a preset (CausalLmConfig::preset_names()), a Hugging Face config.json,
// or a directory holding one. Throws InvalidArgumentError naming `flag`, with the presets.
models::CausalLmConfig resolve_model(const std::string& spec, std::string_view flag = "--model");

// "24GiB", "80GB", "512MiB", "1.5TB", "1073741824" (bytes; a unit's "B" may be left off, and
// case does not matter: 24gib, 80g); 0 is allowed. Throws InvalidArgumentError naming `flag` and
// the units it takes.
std::int64_t parse_byte_size(std::string_view text, std::string_view flag);
// "7.5e9", "70M", "6.9B", "410m": a parameter count (K, M, B or G, T suffixes: 1e3 ...).
std::int64_t parse_count(std::string_view text, std::string_view flag);

}  // namespace trainyard::plan
