#include "trainyard/optim/sharded_adam.h"

#include <c10/util/string_utils.h>
#include <torch/torch.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "trainyard/checkpoint/torch_state.h"
#include "trainyard/comm/collectives.h"
#include "trainyard/comm/process_group.h"
#include "trainyard/comm/shm_process_group.h"
#include "trainyard/error.h"
#include "trainyard/optim/fused_adam.h"
#include "trainyard/optim/state_key.h"

namespace trainyard::optim {

// Note [Optimizer sharding]
// Under DDP every rank holds the same averaged gradients and would run the same Adam update on
// every parameter: with W ranks, W copies of the moments and W times the optimizer's memory
// traffic (on this CPU, ~45 ms a step for ResNet-18, a tenth of the step). Instead each rank owns
// whole parameters, about 1/W of the elements (largest first, each to the least loaded rank),
// keeps Adam's moments for those only and updates only those; Adam is element-wise, so the result
// is the same as an unsharded update bit for bit. Then each rank's parameters are broadcast from
// it. So that this is one broadcast per rank and no packing, the constructor moves the parameters
// that rank r owns into one contiguous buffer flat_[r], each parameter a view of its slice
// (Tensor::set_data, as PyTorch's flat parameters do): the parameters keep their identity,
// gradient accumulators and DDP hooks, and a copy into them (loading a checkpoint) lands in the
// buffer. A parameter given other storage (Module::load sets a parameter to the tensor it read)
// is copied back into its slot at the next step. Checkpoints hold the whole state as unsharded
// Adam writes it, not one file per rank: state_to_bytes gathers the moments from their owners (one
// broadcast per owner, which for two ranks is what a gather costs; with many ranks, per-rank
// shards would scale better), and load_state_bytes keeps the owned part, whatever world size
// wrote it.

namespace {

OptimizerStateKey state_key(const torch::Tensor& p) {
  return optimizer_state_key(p);
}

void wait_all(std::vector<c10::intrusive_ptr<c10d::Work>>& works,
              const char* what,
              int rank,
              int world_size) {
  std::string first_error;
  for (auto& w : works) {
    try {
      wait_work(w);  // beats while it waits: Note [Hang watchdog]
    } catch (const std::exception& e) {
      if (first_error.empty()) first_error = e.what();
    }
  }
  if (!first_error.empty())
    throw NetworkError(trainyard::detail::concat(
        "ShardedAdam on rank ", rank, "/", world_size, ": ", what, " failed: ", first_error,
        " HINT: another rank probably died or timed out; its own "
        "log names the root cause."));
}

}  // namespace

ShardedAdam::ShardedAdam(std::vector<torch::Tensor> params,
                         torch::optim::AdamOptions options,
                         c10::intrusive_ptr<c10d::ProcessGroup> process_group)
    : params_(std::move(params)), options_(std::move(options)), pg_(std::move(process_group)) {
  TY_CHECK(pg_, "ShardedAdam needs a process group, got null.");
  TY_CHECK(!params_.empty(), "ShardedAdam needs at least one parameter.");
  rank_ = pg_->getRank();
  world_size_ = pg_->getSize();
  std::set<const void*> seen;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto& p = params_[i];
    TY_CHECK(p.defined() && p.layout() == torch::kStrided && p.scalar_type() == torch::kFloat32,
             "ShardedAdam supports dense float32 parameters; parameter ", i, " is ",
             p.defined() ? p.toString() : std::string("undefined"), ".");
    TY_CHECK(p.device() == params_.front().device(), "ShardedAdam: parameter ", i, " is on ",
             p.device().str(), " but parameter 0 on ", params_.front().device().str(),
             "; all parameters must share one device (the rank's).");
    TY_CHECK(seen.insert(p.unsafeGetTensorImpl()).second, "ShardedAdam: parameter ", i,
             " appears twice in the list (a weight tied between modules?). Pass it once.");
  }
  partition();
  move_into_flat_buffers();
  local_ = std::make_unique<FusedAdam>(owned_by(rank_), options_);
}

ShardedAdam::~ShardedAdam() = default;

void ShardedAdam::partition() {
  // See Note [Optimizer sharding]: the same greedy choice on every rank.
  std::vector<std::size_t> order(params_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [this](std::size_t a, std::size_t b) {
    return params_[a].numel() > params_[b].numel();
  });
  std::vector<std::int64_t> load(static_cast<std::size_t>(world_size_), 0);
  owner_.assign(params_.size(), 0);
  for (auto i : order) {
    const auto least = std::min_element(load.begin(), load.end()) - load.begin();
    owner_[i] = static_cast<int>(least);
    load[static_cast<std::size_t>(least)] += params_[i].numel();
  }
}

void ShardedAdam::move_into_flat_buffers() {
  torch::NoGradGuard no_grad;
  flat_.clear();
  offset_.assign(params_.size(), 0);
  for (int r = 0; r < world_size_; ++r) {
    std::int64_t numel = 0;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (owner_[i] != r) continue;
      offset_[i] = numel;
      numel += params_[i].numel();
    }
    flat_.push_back(allocate_collective_buffer(
        pg_, numel, torch::dtype(torch::kFloat32).device(params_.front().device())));
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    auto slot = slot_of(i);
    slot.copy_(params_[i]);
    params_[i].set_data(slot);
  }
}

torch::Tensor ShardedAdam::slot_of(std::size_t index) const {
  const auto& flat = flat_[static_cast<std::size_t>(owner_[index])];
  const auto& p = params_[index];
  return torch::empty({0}, flat.options())
      .set_(flat.storage(), offset_[index], p.sizes(), c10::contiguous_strides(p.sizes()));
}

void ShardedAdam::return_moved_parameters() {
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto& flat = flat_[static_cast<std::size_t>(owner_[i])];
    if (params_[i].data_ptr() == flat.data_ptr<float>() + offset_[i]) continue;  // every step
    auto slot = slot_of(i);
    slot.copy_(params_[i]);
    params_[i].set_data(slot);
  }
}

std::vector<torch::Tensor> ShardedAdam::owned_by(int rank) const {
  std::vector<torch::Tensor> out;
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (owner_[i] == rank) out.push_back(params_[i]);
  return out;
}

std::int64_t ShardedAdam::owned_numel() const {
  return flat_[static_cast<std::size_t>(rank_)].numel();
}

void ShardedAdam::zero_grad() {
  for (auto& p : params_) {
    auto& g = p.mutable_grad();
    if (!g.defined()) continue;
    g.detach_();
    g.zero_();
  }
}

void ShardedAdam::step() {
  return_moved_parameters();
  local_->step();
  if (world_size_ == 1) return;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (int r = 0; r < world_size_; ++r) {
    if (flat_[static_cast<std::size_t>(r)].numel() == 0) continue;
    std::vector<torch::Tensor> tensors{flat_[static_cast<std::size_t>(r)]};
    c10d::BroadcastOptions opts;
    opts.rootRank = r;
    works.push_back(comm::broadcast(pg_, tensors, opts));
  }
  wait_all(works, "broadcasting the updated parameters", rank_, world_size_);
}

std::string ShardedAdam::state_to_bytes(int root) {
  TY_CHECK(root >= 0 && root < world_size_, "ShardedAdam::state_to_bytes: root ", root,
           " is outside [0, ", world_size_, ").");
  torch::NoGradGuard no_grad;
  const bool amsgrad = options_.amsgrad();
  const int moments = amsgrad ? 3 : 2;
  FusedAdam full(params_, options_);
  full.param_groups()[0].set_options(local_->param_groups()[0].options().clone());
  for (int r = 0; r < world_size_; ++r) {
    std::vector<std::size_t> owned;
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (owner_[i] == r) owned.push_back(i);
    if (owned.empty()) continue;
    const std::int64_t numel = flat_[static_cast<std::size_t>(r)].numel();
    // (owned,) Adam's step per parameter, 0 where it has no state yet;
    // (moments, numel) exp_avg, exp_avg_sq [, max_exp_avg_sq], parameters back to back.
    auto steps = torch::zeros({static_cast<std::int64_t>(owned.size())}, torch::kInt64);
    auto values = torch::zeros({moments, numel}, torch::kFloat32);
    if (r == rank_) {
      std::int64_t offset = 0;
      for (std::size_t k = 0; k < owned.size(); ++k) {
        const auto& p = params_[owned[k]];
        auto it = local_->state().find(state_key(p));
        if (it != local_->state().end()) {
          auto& s = static_cast<torch::optim::AdamParamState&>(*it->second);
          steps[static_cast<std::int64_t>(k)] = s.step();
          values[0].narrow(0, offset, p.numel()).copy_(s.exp_avg().reshape({-1}));
          values[1].narrow(0, offset, p.numel()).copy_(s.exp_avg_sq().reshape({-1}));
          if (amsgrad)
            values[2].narrow(0, offset, p.numel()).copy_(s.max_exp_avg_sq().reshape({-1}));
        }
        offset += p.numel();
      }
    }
    if (world_size_ > 1) {
      std::vector<c10::intrusive_ptr<c10d::Work>> works;
      for (auto* t : {&steps, &values}) {
        std::vector<torch::Tensor> tensors{*t};
        c10d::BroadcastOptions opts;
        opts.rootRank = r;
        works.push_back(comm::broadcast(pg_, tensors, opts));
      }
      wait_all(works, "gathering the optimizer state", rank_, world_size_);
    }
    if (rank_ != root) continue;
    std::int64_t offset = 0;
    for (std::size_t k = 0; k < owned.size(); ++k) {
      const auto& p = params_[owned[k]];
      const auto step = steps[static_cast<std::int64_t>(k)].item<std::int64_t>();
      if (step > 0) {
        auto s = std::make_unique<torch::optim::AdamParamState>();
        s->step(step);
        s->exp_avg(values[0].narrow(0, offset, p.numel()).view(p.sizes()).clone());
        s->exp_avg_sq(values[1].narrow(0, offset, p.numel()).view(p.sizes()).clone());
        if (amsgrad)
          s->max_exp_avg_sq(values[2].narrow(0, offset, p.numel()).view(p.sizes()).clone());
        full.state()[state_key(p)] = std::move(s);
      }
      offset += p.numel();
    }
  }
  return rank_ == root ? checkpoint::optimizer_to_bytes(full) : std::string();
}

void ShardedAdam::load_state_bytes(const std::string& bytes, const std::string& what) {
  FusedAdam full(params_, options_);
  checkpoint::load_optimizer(full, bytes, what);
  // Every rank checks every entry, so a mismatch fails all ranks here, not one of them mid-step.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    auto it = full.state().find(state_key(params_[i]));
    if (it == full.state().end()) continue;
    const auto& s = static_cast<const torch::optim::AdamParamState&>(*it->second);
    auto fits = [&](const torch::Tensor& t) {
      return t.defined() && t.sizes() == params_[i].sizes() && t.scalar_type() == torch::kFloat32;
    };
    TY_CHECK_T(CheckpointCorruptError,
               fits(s.exp_avg()) && fits(s.exp_avg_sq()) &&
                   (!options_.amsgrad() || fits(s.max_exp_avg_sq())),
               what, ": the Adam state of parameter ", i, " does not fit its shape ",
               params_[i].sizes(),
               options_.amsgrad() ? " (or lacks max_exp_avg_sq for amsgrad)" : "",
               ". HINT: was it written for another model or optimizer configuration?");
  }
  local_->state().clear();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (owner_[i] != rank_) continue;
    auto it = full.state().find(state_key(params_[i]));
    if (it == full.state().end()) continue;
    // Checkpoints hold CPU tensors; the moments live where their parameter does.
    auto state = it->second->clone();
    auto& adam = static_cast<torch::optim::AdamParamState&>(*state);
    const auto device = params_[i].device();
    adam.exp_avg(adam.exp_avg().to(device));
    adam.exp_avg_sq(adam.exp_avg_sq().to(device));
    if (adam.max_exp_avg_sq().defined()) adam.max_exp_avg_sq(adam.max_exp_avg_sq().to(device));
    local_->state()[it->first] = std::move(state);
  }
}

}  // namespace trainyard::optim
