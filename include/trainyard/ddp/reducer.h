// DdpReducer: the engine of DistributedDataParallel. It groups a module's gradients into buckets
// in reverse registration order and all-reduces each bucket from autograd hooks as soon as its
// last gradient lands, so communication overlaps the rest of backward; averaged gradients are in
// place when backward() returns. See Note [Bucket order] in reducer.cpp.
#pragma once

#include <torch/nn/module.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace trainyard::nn {
class GradientHooks;
}

namespace trainyard::ddp {

struct DdpOptions {
  static constexpr std::size_t kDefaultBucketBytes = 25u << 20;
  static constexpr std::size_t kDefaultFirstBucketBytes = 1u << 20;

  // Target size of each gradient bucket; a single larger parameter gets a bucket of its own.
  std::size_t bucket_size_bytes = kDefaultBucketBytes;
  // The first bucket (the last layers' gradients, ready first) is kept small so communication
  // starts early in backward, as PyTorch does.
  std::size_t first_bucket_size_bytes = kDefaultFirstBucketBytes;
  // Broadcast buffers (BatchNorm running statistics) from rank 0 before every training forward.
  bool broadcast_buffers = true;
  // Allow parameters that get no gradient in a backward pass (on some or all ranks). Costs one
  // small extra all-reduce per step. When false, such a parameter is reported by name.
  bool find_unused_parameters = false;
};

// What happened in the most recent synchronised backward pass.
struct DdpStepStats {
  int bucket_count = 0;
  // Buckets whose all-reduce started from an autograd hook, before backward() finished.
  int buckets_launched_in_backward = 0;
  // Parameters that got no gradient on this rank (find_unused_parameters only).
  int locally_unused_parameters = 0;
  // Time backward spent blocked at its end waiting for all-reduces to finish (not overlapped).
  double exposed_comm_ms = 0;
};

class DdpReducer {
 public:
  // Broadcasts the module's parameters and buffers from rank 0 and checks that every rank holds
  // the same parameter layout. Blocks; collective. `module` must outlive the reducer.
  DdpReducer(std::shared_ptr<torch::nn::Module> module,
             c10::intrusive_ptr<c10d::ProcessGroup> process_group,
             DdpOptions options = {});
  ~DdpReducer();
  DdpReducer(const DdpReducer&) = delete;
  DdpReducer& operator=(const DdpReducer&) = delete;

  // Call before each forward pass (DistributedDataParallel::forward does): broadcasts buffers when
  // training and decides whether the coming backward synchronises (it does unless inside no_sync).
  void prepare_forward();

  // While false, forward passes prepared from now on lead to backward passes that accumulate
  // gradients locally without communication (the choice is made in prepare_forward).
  void set_require_sync(bool require_sync) { require_sync_ = require_sync; }

  // Broadcasts the module's buffers from rank 0, e.g. before evaluating, so every rank evaluates
  // the same model. Blocks; collective.
  void sync_buffers();
  bool require_sync() const { return require_sync_; }

  const DdpStepStats& last_step_stats() const { return stats_; }
  int bucket_count() const { return static_cast<int>(buckets_.size()); }

  // Internal: called from the gradient-accumulator hooks and the end-of-backward callback.
  void on_gradient_ready(std::size_t param_index);

 private:
  struct Bucket;
  void build_buckets();
  void broadcast_from_rank0(const std::vector<torch::Tensor>& tensors);
  void verify_layout_across_ranks();
  torch::Tensor bucket_view(std::size_t param_index) const;  // the parameter's slot, its shape
  void stage_gradient(std::size_t param_index);              // local gradient -> its slot
  void launch_ready_buckets(bool from_hook);
  void finalize_backward();
  void reset_backward_state();
  void abandon_backward();  // waits for launched all-reduces, then resets

  std::shared_ptr<torch::nn::Module> module_;
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  DdpOptions options_;
  int rank_ = 0;
  int world_size_ = 1;
  // The group averages (AVG) float buckets in its reduction pass; Gloo cannot.
  bool average_in_collective_ = false;
  bool device_group_ = false;  // the group has a GPU backend (capabilities_of().device_tensors)

  std::vector<torch::Tensor> params_;  // trainable parameters, registration order
  std::vector<std::string> param_names_;
  std::unique_ptr<nn::GradientHooks> hooks_;  // calls on_gradient_ready
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<std::size_t> bucket_of_param_;
  std::vector<std::int64_t> offset_of_param_;  // element offset inside its bucket

  // Per-backward state. The autograd engine runs hooks of one backward on one thread.
  std::vector<bool> ready_;
  std::size_t next_bucket_ = 0;
  bool backward_started_ = false;
  bool sync_this_backward_ = true;
  bool require_sync_ = true;
  int launched_in_backward_ = 0;
  DdpStepStats stats_;
};

}  // namespace trainyard::ddp
