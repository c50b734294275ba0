// FSDP's engine, shared by its translation units; not public. See Note [FSDP lifecycle] in
// fully_sharded_data_parallel.cpp, which builds the engine; units.cpp builds the flat buffers,
// forward.cpp gathers and frees them around each unit, backward.cpp reduces the gradients and
// state_dict.cpp saves and loads the shards.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trainyard/comm/process_group.h"
#include "trainyard/fsdp/fully_sharded_data_parallel.h"
#include "trainyard/nn/grad_hooks.h"
#include "trainyard/nn/unit_hook.h"

namespace trainyard::fsdp {

// Helpers the engine's files share.

using Clock = std::chrono::steady_clock;

inline double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// A parameter whose values do not exist yet: a CPU tensor with a shape but no memory (a model
// built for deferred initialisation).
inline bool is_deferred(const torch::Tensor& p) {
  return p.numel() > 0 && !p.is_meta() && p.storage().nbytes() == 0;
}

// A tensor of `shape` and `dtype` over `storage` (on its device) from element `offset`, not an
// autograd view.
inline torch::Tensor view_of(const c10::Storage& storage,
                             std::int64_t offset,
                             at::IntArrayRef shape,
                             torch::ScalarType dtype) {
  return torch::empty({0}, torch::TensorOptions().dtype(dtype).device(storage.device()))
      .set_(storage, offset, shape, c10::contiguous_strides(shape));
}

inline void wait_or_throw(const c10::intrusive_ptr<c10d::Work>& work,
                          const char* what,
                          int rank,
                          int world_size) {
  wait_collective(work, "FullyShardedDataParallel", what, rank,
                  world_size);  // beats: Note [Hang watchdog]
}

struct ParamSlot {
  std::string name;
  torch::Tensor param;  // the module's own parameter; its data views FlatParam::gathered
  std::vector<std::int64_t> shape;
  std::int64_t offset = 0;  // elements into the flat buffer
  std::int64_t numel = 0;
};

// One flat buffer of a unit: its trainable parameters, or its frozen ones.
struct FlatParam {
  std::vector<ParamSlot> slots;
  bool trainable = true;
  std::int64_t numel = 0;         // sum of the parameters' elements
  std::int64_t padded_numel = 0;  // numel rounded up to a multiple of the shard group size
  std::int64_t shard_numel = 0;   // padded_numel / shard group size
  torch::Tensor shard;            // (shard_numel,) shard_dtype(), this rank's part
  c10::Storage gathered;          // padded_numel compute-dtype elements when gathered, else none
  bool aliases_shard = false;     // one shard in fp32: the parameters view the shard itself
  bool is_gathered = false;
  c10::intrusive_ptr<c10d::Work> gather_work;  // an all-gather in flight into `gathered`
  std::size_t grads_pending = 0;               // this backward's gradients not yet accumulated
  std::vector<bool> grad_ready;
  bool reduced = false;  // its gradient reduction was issued in this backward
  // (padded_numel,) compute dtype, zeroed, that the parameters' .grad view during this backward
  // so autograd accumulates into it in place; undefined when they have gradients of their own.
  // Note [Gradients in place].
  torch::Tensor grad_buffer;
};

struct Unit {
  std::string name;           // "" for the root
  torch::nn::Module* module;  // owned by the root module, which FSDP keeps alive
  std::vector<std::unique_ptr<FlatParam>> flats;
  int order = -1;  // position in this iteration's forward order
  bool pre_backward_done = false;
  bool has_frozen = false;
  // This iteration's backward has produced the gradient of the unit's input: every frozen weight
  // of the unit has served its input gradients (Note [Freeing units with frozen parameters]).
  bool input_grad_done = false;
};

struct PendingReduction {
  FlatParam* flat;
  torch::Tensor input;   // (padded_numel,) reduce dtype: alive until the collective completes
  torch::Tensor output;  // (shard_numel,) fp32, averaged into the shard's gradient
  c10::intrusive_ptr<c10d::Work> scatter;    // reduce-scatter in the shard group, or null
  c10::intrusive_ptr<c10d::Work> replicate;  // all-reduce across replicas, or null
};

class FsdpState {
 public:
  FsdpState(std::shared_ptr<torch::nn::Module> module, FsdpGroups groups, FsdpOptions options);
  ~FsdpState();

  void pre_forward();
  torch::Tensor post_forward(torch::Tensor output);
  torch::Tensor run_unit(Unit& unit, const torch::Tensor& input, const nn::UnitForward& forward);

  std::vector<torch::Tensor> parameters() const;
  double clip_grad_norm(double max_norm);
  std::vector<std::pair<std::string, torch::Tensor>> full_parameters(
      const std::optional<std::string>& unit);
  std::vector<std::string> unit_names() const;
  std::int64_t sharded_state_bytes() const;

  FsdpOptions options_;
  FsdpStats stats_;
  bool require_sync_ = true;

  // For the state dicts (state_dict.cpp).
  const std::vector<std::unique_ptr<Unit>>& units() const { return units_; }
  int shard_rank() const { return shard_rank_; }
  int shard_size() const { return shard_size_; }
  int replicate_rank() const { return groups_.replicate ? groups_.replicate->getRank() : 0; }
  int replicate_size() const { return replicate_size_; }
  int global_rank() const { return replicate_rank() * shard_size_ + shard_rank_; }
  int world_size() const { return groups_.world_size; }
  // The smallest of every rank's `value`. Collective.
  std::int64_t all_min(std::int64_t value);
  // Drops every gathered copy (they would be stale once the shards change). Between steps only.
  void free_all();
  // Frees `unit` once its backward is over: every trainable buffer reduced and, with frozen
  // parameters, its input's gradient computed. Never the root.
  void free_after_backward(Unit& unit);
  // The dtype of a flat buffer's shard: MixedPrecision.shard_dtype (fp32 by default) for
  // trainable ones, the compute dtype for frozen ones (Note [Frozen shards]).
  torch::ScalarType shard_dtype(bool trainable) const {
    return trainable ? trainable_dtype_ : compute_dtype_;
  }

 private:
  class Hook;
  torch::Device choose_device() const;
  void select_units();
  void build_flat(Unit& unit, std::vector<ParamSlot> slots, bool trainable);
  // build_flat's steps. Checks `slots` and lays them out in `flat` (offsets, padded and shard
  // sizes); true when any parameter is deferred.
  bool lay_out(FlatParam& flat, std::vector<ParamSlot>& slots) const;
  // Fills flat.shard: from param_slice_init (Note [Initialising by slices]), or from the full
  // values (param_init for deferred parameters, else their own, synchronised from rank 0).
  void shard_from_slices(FlatParam& flat, const std::vector<ParamSlot>& slots);
  void shard_from_full_values(FlatParam& flat, const std::vector<ParamSlot>& slots, bool deferred);
  // Sets flat.gathered: the shard's own storage when it aliases it, else one to gather into.
  void make_gathered_storage(FlatParam& flat);
  void sync_initial_values(torch::Tensor& full);
  void gather(Unit& unit, bool prefetch);
  void wait_gathered(Unit& unit);
  void free_unit(Unit& unit);
  void maybe_prefetch(Unit* unit);
  Unit* neighbour(const Unit& unit, int step);
  int gathered_unit_count() const;
  void start_backward();
  void pre_backward(Unit& unit);
  void give_gradient_buffer(FlatParam& flat);
  void on_gradient_ready(std::size_t index);
  void reduce_flat(FlatParam& flat);
  void launch_replica_reductions(bool all);
  void settle_reductions(bool all);
  void finalize_backward();
  void abandon_backward();
  std::string where() const;
  // (numel,) of `dtype` on device_, uninitialised, from a caching allocator (Note [FSDP buffers]).
  torch::Tensor cached_buffer(std::int64_t numel, torch::ScalarType dtype);
  // nbytes on device_ for a gathered buffer, from the same allocators.
  at::DataPtr gathered_memory(std::size_t nbytes);

  std::shared_ptr<torch::nn::Module> root_;
  FsdpGroups groups_;
  int shard_rank_ = 0;
  int shard_size_ = 1;
  int replicate_size_ = 1;
  torch::Device device_ = torch::kCPU;  // of everything FSDP allocates: Note [FSDP device]
  torch::ScalarType trainable_dtype_ = torch::kFloat32;  // Note [Pure bf16]
  torch::ScalarType compute_dtype_ = torch::kFloat32;
  torch::ScalarType reduce_dtype_ = torch::kFloat32;
  bool reshard_after_forward_ = true;

  std::vector<std::unique_ptr<Unit>> units_;                    // [0] is the root
  std::vector<std::pair<FlatParam*, std::size_t>> grad_index_;  // hook index -> flat, slot
  std::unique_ptr<nn::GradientHooks> grad_hooks_;
  std::vector<std::shared_ptr<Hook>> unit_hooks_;

  std::vector<Unit*> forward_order_;  // this iteration's
  std::vector<Unit*> previous_order_;
  std::deque<PendingReduction> pending_;  // issued in this order, settled from the front
  std::int64_t reduction_bytes_ = 0;      // full gradients of pending_ still alive
  std::int64_t gathered_bytes_ = 0;
  bool backward_started_ = false;
  bool settled_this_backward_ = false;  // a reduction reached a shard's gradient in this backward
  bool sync_this_backward_ = true;
};

}  // namespace trainyard::fsdp
