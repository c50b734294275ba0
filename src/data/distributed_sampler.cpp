#include "trainyard/data/distributed_sampler.h"

#include <algorithm>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "trainyard/error.h"

namespace trainyard::data {

DistributedSampler::DistributedSampler(SamplerOptions options) : options_(options) {
  TY_CHECK(options_.dataset_size > 0, "SamplerOptions.dataset_size must be > 0, got ",
           options_.dataset_size, ".");
  TY_CHECK(options_.num_replicas >= 1, "SamplerOptions.num_replicas must be >= 1, got ",
           options_.num_replicas, ".");
  TY_CHECK(options_.rank >= 0 && options_.rank < options_.num_replicas, "SamplerOptions.rank ",
           options_.rank, " is outside [0, ", options_.num_replicas, ").");
  const auto n = options_.dataset_size;
  const auto r = options_.num_replicas;
  if (options_.drop_last) {
    TY_CHECK(n >= r, "DistributedSampler with drop_last: ", n, " samples cannot feed ", r,
             " replicas.");
    num_samples_ = n / r;
  } else {
    num_samples_ = (n + r - 1) / r;
  }
}

std::vector<std::int64_t> DistributedSampler::indices(std::int64_t start) const {
  TY_CHECK(start >= 0, "DistributedSampler::indices: start must be >= 0, got ", start, ".");
  start -= start % options_.num_replicas;
  const auto n = options_.dataset_size;
  std::vector<std::int64_t> all;
  all.reserve(static_cast<std::size_t>(total_size()));
  if (options_.shuffle) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(options_.seed + epoch_);
    auto perm = torch::randperm(n, gen, torch::kInt64);
    const auto* p = perm.data_ptr<std::int64_t>();
    all.assign(p, p + n);
  } else {
    for (std::int64_t i = 0; i < n; ++i) all.push_back(i);
  }
  // Pad by wrapping around (repeatedly, for tiny data sets), or trim, to total_size().
  for (std::size_t i = 0; static_cast<std::int64_t>(all.size()) < total_size(); ++i)
    all.push_back(all[i]);
  all.resize(static_cast<std::size_t>(total_size()));

  std::vector<std::int64_t> mine;
  mine.reserve(static_cast<std::size_t>(std::max<std::int64_t>(0, num_samples_ - start / options_.num_replicas)));
  for (auto i = static_cast<std::size_t>(start + options_.rank); i < all.size();
       i += static_cast<std::size_t>(options_.num_replicas))
    mine.push_back(all[i]);
  return mine;
}

}  // namespace trainyard::data
