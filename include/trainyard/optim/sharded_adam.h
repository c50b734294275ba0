// ShardedAdam: Adam whose state and update are split across the ranks of a process group, ZeRO
// stage 1 (PyTorch's ZeroRedundancyOptimizer over Adam). Each rank owns a share of the parameters,
// keeps Adam's moments for those only and updates only those; the updated parameters then travel
// from their owners to every rank. Use it with DistributedDataParallel, whose averaged gradients
// it reads. See Note [Optimizer sharding] in sharded_adam.cpp.
#pragma once

#include <torch/optim/adam.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace trainyard::optim {

class FusedAdam;

// Not thread-safe: one thread drives it, as it drives the model's forward and backward.
class ShardedAdam {
 public:
  // Collective. Every rank passes the same parameters in the same order, with the same values
  // (DistributedDataParallel has broadcast them). The parameters are moved into one contiguous
  // buffer per owning rank (their values and identities stay; see the Note).
  ShardedAdam(std::vector<torch::Tensor> params,
              torch::optim::AdamOptions options,
              c10::intrusive_ptr<c10d::ProcessGroup> process_group);
  ~ShardedAdam();
  ShardedAdam(const ShardedAdam&) = delete;
  ShardedAdam& operator=(const ShardedAdam&) = delete;

  // Zeroes every parameter's gradient in place (DDP's bucket views stay). Local.
  void zero_grad();
  // Adam on this rank's parameters, then every parameter from its owner. Collective; blocks.
  void step();

  // Collective. The whole optimizer state, in the archive format of torch::optim::Adam (and
  // FusedAdam) over all parameters, so a checkpoint moves freely between world sizes and between
  // sharded and unsharded runs. Only rank `root` gets the bytes; the others get "". Call it at
  // the same step on every rank.
  std::string state_to_bytes(int root = 0);
  // Loads a state written by state_to_bytes, torch::optim::Adam or FusedAdam over the same
  // parameters; this rank keeps the moments of the parameters it owns. The options stay those
  // given to the constructor, as with torch::optim::Adam::load. Local. `what` names the source in
  // errors (CheckpointCorruptError).
  void load_state_bytes(const std::string& bytes, const std::string& what);

  // The rank that updates parameter `index` (an index into the constructor's list).
  int owner(std::size_t index) const { return owner_[index]; }
  // Elements of the parameters this rank owns.
  std::int64_t owned_numel() const;
  const torch::optim::AdamOptions& options() const { return options_; }

 private:
  void partition();
  void move_into_flat_buffers();
  torch::Tensor slot_of(std::size_t index) const;  // the parameter's place in its owner's buffer
  void return_moved_parameters();
  std::vector<torch::Tensor> owned_by(int rank) const;

  std::vector<torch::Tensor> params_;
  torch::optim::AdamOptions options_;
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  int rank_ = 0;
  int world_size_ = 1;
  std::vector<int> owner_;            // per parameter
  std::vector<torch::Tensor> flat_;   // per rank: (numel owned by it,) its parameters back to back
  std::vector<std::int64_t> offset_;  // per parameter: element offset in its owner's buffer
  std::unique_ptr<FusedAdam> local_;  // over this rank's parameters only
};

}  // namespace trainyard::optim
