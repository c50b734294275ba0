// FullyShardedDataParallel<M>: ZeRO-3 for LibTorch modules. The model's parameters are grouped
// into units (a wrap policy picks them; the root keeps the rest); each unit's parameters live as
// one flat buffer, padded to a multiple of the shard group's size, of which a rank keeps only its
// 1/W shard in fp32 (or bf16: MixedPrecision.shard_dtype). A unit's full parameters are
// all-gathered just before its forward (and, under FULL_SHARD, again before its backward) and
// freed after; its gradients are reduce-scattered into the shards as soon as backward has
// produced them. The optimizer steps the local shards: see Note [FSDP lifecycle] in
// src/fsdp/fully_sharded_data_parallel.cpp.
//
//   trainyard::fsdp::FullyShardedDataParallel fsdp(model, dist, {
//       .sharding = Strategy::kFullShard,
//       .wrap = wrap_modules_of_type<models::GptNeoXLayerImpl>()});
//   torch::optim::AdamW opt(fsdp.parameters(), ...);   // the local fp32 shards
//   auto loss = models::causal_lm_loss(fsdp.forward(ids), ids);
//   loss.backward();                                    // gradients land in the shards' .grad
//   opt.step();
//
// A unit runs its hooks only when the model calls it through trainyard::nn::call_unit (see
// nn/unit_hook.h); GptNeoX does.
#pragma once

#include <torch/types.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "trainyard/fsdp/wrap_policy.h"
#include "trainyard/nn/module_ptr.h"
#include "trainyard/strategy.h"

namespace trainyard {
class Distributed;
}

namespace trainyard::fsdp {

enum class BackwardPrefetch {
  kNone,
  kBackwardPre,   // gather the next unit's parameters when this unit's backward starts
  kBackwardPost,  // ... when this unit's backward has finished
};

struct MixedPrecision {
  // Dtype of the gathered parameters, so of the forward and backward compute (e.g. bf16).
  // nullopt: shard_dtype.
  std::optional<torch::ScalarType> param_dtype;
  // Dtype gradients are communicated in; shared-memory reductions accumulate bf16 in fp32
  // (Note [Flat collectives in shared memory] in src/comm/shm_process_group.cpp), the Gloo ring
  // rounds partial sums to bf16 between hops (Note [Ring collectives]). nullopt: param_dtype.
  std::optional<torch::ScalarType> reduce_dtype;
  // Dtype the module's buffers are cast to at construction. nullopt: unchanged.
  std::optional<torch::ScalarType> buffer_dtype;
  // Dtype of the trainable shards the optimizer updates, so of their gradients and of the
  // optimizer's state. nullopt: fp32, a master copy whatever param_dtype is. bf16 with
  // param_dtype and reduce_dtype bf16 is "pure bf16" (llama-recipes' --pure_bf16): 2 + 2 bytes a
  // sharded element instead of 4 + 4, plus the optimizer's bf16 moments; see Note [Pure bf16].
  std::optional<torch::ScalarType> shard_dtype;
};

// Gives a parameter created on the meta device its initial values (filled in place into an fp32
// CPU tensor of its shape; FSDP copies them to its device). Called with the qualified parameter
// name; it must depend only on the name (and a seed), never on the rank, so every world size builds
// the same model.
using ParamInit = std::function<void(const std::string& name, torch::Tensor& tensor)>;

// Like ParamInit, for elements [begin, begin + count) of the flattened parameter only, written
// as fp32 to `dst`: FSDP then asks each rank for the slices of its own shards and never builds a
// unit's full values (Note [Initialising by slices]), so a rank loading a checkpoint reads no more
// than it holds. Used instead of param_init when set.
using ParamSliceInit = std::function<void(
    const std::string& name, std::int64_t begin, std::int64_t count, float* dst)>;

struct FsdpOptions {
  Strategy sharding = Strategy::kFullShard;  // one of kFsdpStrategies
  WrapPolicy wrap;
  MixedPrecision mixed_precision;
  BackwardPrefetch backward_prefetch = BackwardPrefetch::kBackwardPre;
  // Start gathering the next unit (in the previous iteration's order) when a unit's forward starts.
  bool forward_prefetch = false;
  // At most two units' gathered parameters alive besides the root's: a prefetch that would
  // exceed it waits until the unit is needed.
  bool limit_all_gathers = true;
  // Recompute each unit's forward in backward instead of keeping its activations
  // (Note [Activation checkpointing] in src/nn/checkpoint.cpp).
  bool activation_checkpointing = false;
  // Sharded checkpoints (fsdp/state_dict.h) hold the frozen parameters too. false: only the
  // trainable ones and their optimizer state, for models whose frozen part is rebuilt from its
  // source on every start (a LoRA base: Note [Frozen shards]).
  bool checkpoint_frozen = true;
  // Required when the model was built on the meta device: see ParamInit.
  ParamInit param_init;
  // For a deferred model: see ParamSliceInit. Takes precedence over param_init.
  ParamSliceInit param_slice_init;
  // The device of the shards, the gathered parameters and every buffer FSDP allocates, with an
  // index (cuda:LOCAL_RANK). nullopt: the parameters' device, which must be one for all of them.
  // Set it to shard a deferred model (whose parameters are CPU tensors without memory) on a GPU;
  // its buffers are moved there. A parameter with values must already be on it. See Note [FSDP
  // device] in src/fsdp/fully_sharded_data_parallel.cpp.
  std::optional<torch::Device> device;
};

// The process groups FSDP runs over. `shard`: the ranks that split each unit (all of them for
// FULL_SHARD; a node's ranks for HYBRID; null for NO_SHARD). `replicate`: the ranks holding the
// same shard, whose gradients are all-reduced (null when there is one replica).
struct FsdpGroups {
  c10::intrusive_ptr<c10d::ProcessGroup> shard;
  c10::intrusive_ptr<c10d::ProcessGroup> replicate;
  int world_size = 1;  // shard size x replicate size
};

// The groups for `strategy` over `world`. HYBRID strategies need the node layout: ranks
// [k * local_world_size, (k + 1) * local_world_size) form node k (the launcher numbers them so);
// the node and cross-node groups are created over `store` (collective, every rank in the same
// order; Gloo binds as init() does for `master_addr`). Throws InvalidArgumentError when
// world_size is not a multiple of local_world_size.
FsdpGroups make_fsdp_groups(Strategy strategy,
                            const c10::intrusive_ptr<c10d::ProcessGroup>& world,
                            const c10::intrusive_ptr<c10d::Store>& store,
                            int local_world_size,
                            const std::string& master_addr = "127.0.0.1");

// What happened in the most recent iteration (forward + backward).
struct FsdpStats {
  int all_gathers = 0;  // flat-buffer all-gathers issued (one per unit per pass that gathers)
  int reduce_scatters = 0;
  int all_reduces = 0;             // gradient all-reduces across replicas (NO_SHARD, HYBRID)
  std::int64_t comm_elements = 0;  // elements this rank sent: (W-1)/W of each gathered or
                                   // reduce-scattered buffer, 2(R-1)/R of each all-reduced one
  int prefetches = 0;              // gathers started ahead of the unit's need
  std::int64_t peak_gathered_bytes = 0;  // largest sum of gathered parameter buffers alive
  // Largest sum of full flat gradients alive while their reduction is in flight (at most
  // kReductionsInFlight + 1 buffers: Note [Settling reductions]).
  std::int64_t peak_reduction_bytes = 0;
  double exposed_comm_ms = 0;  // time compute waited for a gather or for a reduction
};

// make_fsdp_groups over a job's group and store, with its LOCAL_WORLD_SIZE.
FsdpGroups groups_from(const std::shared_ptr<Distributed>& dist, Strategy strategy);

class FsdpState;  // the engine; see src/fsdp/fully_sharded_data_parallel.cpp

class FullyShardedDataParallelBase {
 public:
  FullyShardedDataParallelBase(std::shared_ptr<torch::nn::Module> module,
                               FsdpGroups groups,
                               FsdpOptions options);
  ~FullyShardedDataParallelBase();
  FullyShardedDataParallelBase(const FullyShardedDataParallelBase&) = delete;
  FullyShardedDataParallelBase& operator=(const FullyShardedDataParallelBase&) = delete;

  // The local shards of the trainable parameters (fp32 unless MixedPrecision.shard_dtype), one
  // flat tensor per unit: give these to the optimizer. Their .grad is the averaged gradient after a
  // synchronised backward.
  std::vector<torch::Tensor> parameters() const;

  // Clips the gradients by their global norm across all shards, as one process clipping the full
  // gradients would (torch::nn::utils::clip_grad_norm_). Returns the norm before clipping.
  // Collective.
  double clip_grad_norm_(double max_norm);

  // Every parameter's full value in fp32, by qualified name, as CPU tensors: one unit gathered at
  // a time (or only `unit`, a unit's qualified name, "" for the root's own parameters).
  // Collective.
  std::vector<std::pair<std::string, torch::Tensor>> full_parameters(
      const std::optional<std::string>& unit = std::nullopt);

  // Gradient accumulation: backward passes inside this scope keep full gradients locally and do
  // not communicate; the first backward after it reduces the sum.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(FullyShardedDataParallelBase& fsdp);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    FullyShardedDataParallelBase& fsdp_;  // outlives the guard
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  // Qualified names of the units in their current order (the root, named "", first).
  std::vector<std::string> unit_names() const;
  const FsdpStats& last_stats() const;
  // Bytes this rank holds for the model between steps: its parameter shards and their gradients,
  // excluding optimizer state.
  std::int64_t sharded_state_bytes() const;
  const FsdpOptions& options() const;
  // The engine, for FSDP's own code (state dicts); its type is not public.
  FsdpState& state() { return *state_; }

 protected:
  void pre_forward();
  torch::Tensor post_forward(torch::Tensor output);

 private:
  std::unique_ptr<FsdpState> state_;
};

template <typename M>
class FullyShardedDataParallel : public FullyShardedDataParallelBase {
 public:
  FullyShardedDataParallel(M module, FsdpGroups groups, FsdpOptions options = {})
      : FullyShardedDataParallelBase(nn::module_ptr(module), std::move(groups), std::move(options)),
        module_(std::move(module)) {}
  // Groups from the job's environment (make_fsdp_groups with LOCAL_WORLD_SIZE).
  FullyShardedDataParallel(M module,
                           const std::shared_ptr<Distributed>& dist,
                           FsdpOptions options = {})
      : FullyShardedDataParallel(
            std::move(module), groups_from(dist, options.sharding), std::move(options)) {}

  // The module's forward with the root's parameters gathered; the output must be one tensor.
  template <typename... Args>
  torch::Tensor forward(Args&&... args) {
    pre_forward();
    return post_forward(module_->forward(std::forward<Args>(args)...));
  }

  M& module() { return module_; }

 private:
  M module_;
};

}  // namespace trainyard::fsdp
