// FSDP's forward pass: gathering a unit's parameters (prefetching the next unit's), running it,
// and freeing it again (Note [FSDP lifecycle] in fully_sharded_data_parallel.cpp).
#include "fsdp/fsdp_state.h"

#include <torch/torch.h>

#include <algorithm>

#include "trainyard/comm/collectives.h"
#include "trainyard/heartbeat.h"
#include "trainyard/log.h"
#include "trainyard/nn/checkpoint.h"

namespace trainyard::fsdp {

void FsdpState::gather(Unit& unit, bool prefetch) {
  bool issued = false;
  for (auto& flat : unit.flats) {
    if (flat->aliases_shard || flat->is_gathered) continue;
    auto* impl = flat->gathered.unsafeGetStorageImpl();
    const auto nbytes = flat->padded_numel * c10::elementSize(compute_dtype_);
    impl->set_data_ptr_noswap(gathered_memory(nbytes));
    impl->set_nbytes(nbytes);
    flat->is_gathered = true;
    gathered_bytes_ += nbytes;
    stats_.peak_gathered_bytes = std::max(stats_.peak_gathered_bytes, gathered_bytes_);
    torch::NoGradGuard no_grad;
    // (padded_numel,) compute dtype; this rank's slot is its shard.
    auto full = view_of(flat->gathered, 0, {flat->padded_numel}, compute_dtype_);
    auto own = full.narrow(0, shard_rank_ * flat->shard_numel, flat->shard_numel);
    own.copy_(flat->shard);
    if (shard_size_ > 1) {
      flat->gather_work = comm::all_gather_flat(groups_.shard, full, own);
      ++stats_.all_gathers;
      stats_.comm_elements += comm::flat_collective_elements(flat->shard_numel, shard_size_);
    }
    issued = true;
  }
  if (issued && prefetch) ++stats_.prefetches;
}

void FsdpState::wait_gathered(Unit& unit) {
  for (auto& flat : unit.flats) {
    if (!flat->gather_work) continue;
    auto start = Clock::now();
    wait_or_throw(flat->gather_work, "an all-gather of parameters", shard_rank_, shard_size_);
    stats_.exposed_comm_ms += ms_since(start);
    flat->gather_work.reset();
  }
}

void FsdpState::free_unit(Unit& unit) {
  for (auto& flat : unit.flats) {
    if (flat->aliases_shard || !flat->is_gathered) continue;
    if (flat->gather_work) {  // still written into: settle it first
      try {
        flat->gather_work->wait();
      } catch (const std::exception&) {
        // reported by whoever waits for it properly; the memory goes either way
      }
      flat->gather_work.reset();
    }
    auto* impl = flat->gathered.unsafeGetStorageImpl();
    gathered_bytes_ -= static_cast<std::int64_t>(impl->nbytes());
    impl->set_data_ptr_noswap(at::DataPtr(nullptr, impl->device()));  // keeps its device
    impl->set_nbytes(0);
    flat->is_gathered = false;
  }
}

int FsdpState::gathered_unit_count() const {
  int n = 0;
  for (std::size_t i = 1; i < units_.size(); ++i)
    for (auto& flat : units_[i]->flats)
      if (!flat->aliases_shard && flat->is_gathered) {
        ++n;
        break;
      }
  return n;
}

// The unit `step` places after `unit` in the forward order (this iteration's when it has
// reached that far, else the previous iteration's); null at either end.
Unit* FsdpState::neighbour(const Unit& unit, int step) {
  const auto& order = step > 0 && !previous_order_.empty() ? previous_order_ : forward_order_;
  auto it = std::find(order.begin(), order.end(), &unit);
  if (it == order.end()) return nullptr;
  auto pos = (it - order.begin()) + step;
  if (pos < 0 || pos >= static_cast<std::ptrdiff_t>(order.size())) return nullptr;
  return order[pos];
}

void FsdpState::maybe_prefetch(Unit* unit) {
  if (unit == nullptr || unit == units_[0].get()) return;
  bool needs = false;
  for (auto& flat : unit->flats) needs = needs || (!flat->aliases_shard && !flat->is_gathered);
  if (!needs) return;
  if (options_.limit_all_gathers && gathered_unit_count() >= 2) return;
  gather(*unit, /*prefetch=*/true);
}

void FsdpState::pre_forward() {
  if (backward_started_) {
    logger("fsdp")->warn(
        "the previous backward pass did not finish; discarding its reductions and every "
        "shard's gradient");
    abandon_backward();
  }
  if (!forward_order_.empty()) previous_order_ = forward_order_;
  forward_order_.clear();
  for (auto& unit : units_) {
    unit->order = -1;
    unit->pre_backward_done = false;
    unit->input_grad_done = false;
  }
  stats_ = FsdpStats{.peak_gathered_bytes = gathered_bytes_};
  sync_this_backward_ = require_sync_;
  gather(*units_[0], false);
  wait_gathered(*units_[0]);
}

torch::Tensor FsdpState::post_forward(torch::Tensor output) {
  if (!at::GradMode::is_enabled() || !output.requires_grad()) {
    for (auto& unit : units_) free_unit(*unit);  // no backward follows
    return output;
  }
  output.register_hook([this](const torch::Tensor&) { start_backward(); });
  return output;
}

torch::Tensor FsdpState::run_unit(Unit& unit,
                                  const torch::Tensor& input,
                                  const nn::UnitForward& forward) {
  if (unit.order < 0) {
    unit.order = static_cast<int>(forward_order_.size());
    forward_order_.push_back(&unit);
  }
  gather(unit, false);
  if (options_.forward_prefetch) maybe_prefetch(neighbour(unit, +1));
  wait_gathered(unit);

  auto x = input;
  if (x.is_floating_point() && x.scalar_type() != compute_dtype_) x = x.to(compute_dtype_);
  // Recomputing pays only where activations are kept: not for a unit fed token ids (embeddings).
  const bool recompute = options_.activation_checkpointing && x.is_floating_point();
  auto output = recompute ? nn::checkpoint(forward, x) : forward(x);
  heartbeat();  // each unit's forward is progress inside the step: Note [Hang watchdog]
  const bool backward_follows = at::GradMode::is_enabled() && output.requires_grad();
  if (reshard_after_forward_ || !backward_follows) free_unit(unit);
  if (backward_follows) {
    Unit* u = &unit;
    output.register_hook([this, u](const torch::Tensor&) { pre_backward(*u); });
    // See Note [Freeing units with frozen parameters].
    if (unit.has_frozen && x.requires_grad())
      x.register_hook([this, u](const torch::Tensor&) {
        u->input_grad_done = true;
        free_after_backward(*u);
      });
  }
  return output;
}

}  // namespace trainyard::fsdp
