// DistributedSampler with PyTorch's semantics: each epoch a permutation seeded by seed + epoch
// (the same permutation torch.utils.data.DistributedSampler draws), padded by wrapping around (or
// trimmed with drop_last) to a multiple of the replica count, and rank r takes every
// num_replicas-th index starting at r, so ranks get disjoint, equally long slices.
#pragma once

#include <cstdint>
#include <vector>

namespace trainyard::data {

struct SamplerOptions {
  std::int64_t dataset_size = 0;
  int num_replicas = 1;
  int rank = 0;
  bool shuffle = true;
  std::uint64_t seed = 0;
  bool drop_last = false;  // trim the tail instead of padding it
};

class DistributedSampler {
 public:
  explicit DistributedSampler(SamplerOptions options);

  // Selects the permutation; call at the start of every epoch, as with PyTorch's.
  void set_epoch(std::int64_t epoch) { epoch_ = epoch; }
  std::int64_t epoch() const { return epoch_; }

  // This rank's indices for the current epoch, num_samples() of them.
  std::vector<std::int64_t> indices() const { return indices(0); }

  // The rest of this rank's indices for the current epoch after the first `start` positions of
  // the epoch's padded permutation (all ranks together) were consumed: positions start + rank,
  // start + rank + num_replicas, ... For resuming mid-epoch: with the same num_replicas and
  // start = batches done * batch size * num_replicas, this is exactly the tail of indices().
  // A start that is not a multiple of num_replicas (the world size changed) is rounded down so
  // that every rank gets the same count; at most num_replicas - 1 samples are seen twice.
  std::vector<std::int64_t> indices(std::int64_t start) const;
  std::int64_t num_samples() const { return num_samples_; }
  std::int64_t total_size() const { return num_samples_ * options_.num_replicas; }

 private:
  SamplerOptions options_;
  std::int64_t epoch_ = 0;
  std::int64_t num_samples_ = 0;
};

}  // namespace trainyard::data
