// FSDP's backward pass: gathering each unit again, accumulating its gradients into a flat buffer,
// reducing them into the shards' gradients as they complete, and the end of backward (Note [FSDP
// lifecycle] in fully_sharded_data_parallel.cpp).
#include "fsdp/fsdp_state.h"

#include <torch/torch.h>

#include <algorithm>

#include "trainyard/comm/collectives.h"
#include "trainyard/error.h"
#include "trainyard/heartbeat.h"
#include "trainyard/nn/grad_hooks.h"

namespace trainyard::fsdp {

namespace {

// Reductions whose flat gradients may be in flight at once: Note [Settling reductions].
constexpr std::size_t kReductionsInFlight = 2;

}  // namespace

void FsdpState::start_backward() {
  if (backward_started_) return;
  backward_started_ = true;
  for (auto& unit : units_)
    for (auto& flat : unit->flats) {
      flat->grads_pending = flat->trainable ? flat->slots.size() : 0;
      flat->grad_ready.assign(flat->slots.size(), false);
      flat->reduced = false;
    }
  nn::queue_end_of_backward([this] { finalize_backward(); });
}

void FsdpState::pre_backward(Unit& unit) {
  heartbeat();  // as each unit's forward: Note [Hang watchdog]
  start_backward();
  if (unit.pre_backward_done) return;
  unit.pre_backward_done = true;
  gather(unit, false);
  if (options_.backward_prefetch == BackwardPrefetch::kBackwardPre)
    maybe_prefetch(neighbour(unit, -1));
  for (auto& flat : unit.flats) give_gradient_buffer(*flat);
  wait_gathered(unit);
}

// Note [Gradients in place]
// Left alone, autograd hands each parameter a gradient tensor of its own (the output of the
// weight-gradient matmul, or the embedding's dense gradient) and keeps it as .grad until the
// whole flat buffer is ready, when reduce_flat copies them all into the buffer the
// reduce-scatter reads: a unit's worth of malloc'ed gradients alive at once, per unit, per step.
// Instead, before a unit's backward its parameters' .grad are set to views (not autograd views:
// view_of) of one zeroed cached buffer. With a defined gradient and grad mode off (backward
// without create_graph), autograd's AccumulateGrad adds each new gradient into it in place and
// frees it, so each parameter's gradient lives only as long as one add, and when the compute
// and reduce dtypes agree the buffer is the reduce-scatter's input with no copy. The cost is
// zeroing the buffer. A flat buffer whose parameters already hold gradients (an earlier
// no_sync() backward) keeps the copying path, as does the root, which has no pre-backward hook;
// reduce_flat checks that each .grad still views the buffer and copies any that does not.
void FsdpState::give_gradient_buffer(FlatParam& flat) {
  if (!flat.trainable || !sync_this_backward_ || flat.reduced || flat.grad_buffer.defined()) return;
  for (auto& s : flat.slots)
    if (s.param.grad().defined()) return;
  torch::NoGradGuard no_grad;
  flat.grad_buffer = cached_buffer(flat.padded_numel, compute_dtype_).zero_();
  for (auto& s : flat.slots)
    s.param.mutable_grad() = view_of(flat.grad_buffer.storage(), s.offset, s.shape, compute_dtype_);
}

void FsdpState::on_gradient_ready(std::size_t index) {
  heartbeat();
  start_backward();
  auto [flat, slot] = grad_index_[index];
  TY_CHECK(!flat->grad_ready[slot], where(), ": parameter ", flat->slots[slot].name,
           " received its gradient twice in one backward pass. HINT: a unit called twice per "
           "forward needs its own FSDP unit per call, or no_sync() for all but the last backward.");
  flat->grad_ready[slot] = true;
  if (--flat->grads_pending > 0) return;
  reduce_flat(*flat);
  for (auto& unit : units_) {
    const bool mine = std::any_of(unit->flats.begin(), unit->flats.end(),
                                  [&](const auto& f) { return f.get() == flat; });
    if (!mine) continue;
    free_after_backward(*unit);
    break;
  }
}

// Note [Freeing units with frozen parameters]
// A unit whose parameters are all trainable is done with its backward when every gradient has
// arrived. A frozen weight gets no gradient, but its values are read for its input's gradient
// (a LoRA base's matmuls), which may come after the last trainable gradient. So such a unit is
// freed when the gradient of its input has been computed too: every operation inside the unit
// lies between its input and its output, so by then none of them needs its weights. (A unit whose
// input needs no gradient, e.g. the first layer after a frozen embedding, stays gathered until
// the end of backward.) Without this a LoRA model would hold every layer's full weights at once
// at the end of backward: the whole base, unsharded.
void FsdpState::free_after_backward(Unit& unit) {
  const bool done = std::all_of(unit.flats.begin(), unit.flats.end(), [](const auto& f) {
    return !f->trainable || f->grads_pending == 0;
  });
  if (!done || &unit == units_[0].get() || (unit.has_frozen && !unit.input_grad_done)) return;
  if (!std::any_of(unit.flats.begin(), unit.flats.end(),
                   [](const auto& f) { return f->is_gathered && !f->aliases_shard; }))
    return;  // freed already
  free_unit(unit);
  if (options_.backward_prefetch == BackwardPrefetch::kBackwardPost)
    maybe_prefetch(neighbour(unit, -1));
}

void FsdpState::reduce_flat(FlatParam& flat) {
  if (!sync_this_backward_ || flat.reduced) return;
  flat.reduced = true;
  torch::NoGradGuard no_grad;
  PendingReduction r{.flat = &flat};
  // (padded_numel,) reduce dtype: every gradient of the buffer, zero where none or padding.
  if (flat.grad_buffer.defined() && flat.grad_buffer.scalar_type() == reduce_dtype_) {
    r.input = flat.grad_buffer;  // Note [Gradients in place]
  } else if (flat.grad_buffer.defined()) {
    r.input = cached_buffer(flat.padded_numel, reduce_dtype_).copy_(flat.grad_buffer);
  } else {
    r.input = cached_buffer(flat.padded_numel, reduce_dtype_);
    if (flat.padded_numel > flat.numel)
      r.input.narrow(0, flat.numel, flat.padded_numel - flat.numel).zero_();
  }
  for (auto& s : flat.slots) {
    auto dst = r.input.narrow(0, s.offset, s.numel);
    const auto& g = s.param.grad();
    const bool in_place = flat.grad_buffer.defined() && g.defined() &&
                          g.data_ptr() == static_cast<char*>(flat.grad_buffer.data_ptr()) +
                                              s.offset * flat.grad_buffer.element_size();
    if (!in_place && g.defined())  // in place: already in r.input, or in what it was cast from
      dst.copy_(g.reshape(-1));
    else if (!in_place)
      dst.zero_();
    s.param.mutable_grad().reset();  // the full gradient is not kept
  }
  flat.grad_buffer.reset();
  if (shard_size_ > 1) {
    r.output = cached_buffer(flat.shard_numel, torch::kFloat32);
    r.scatter = comm::reduce_scatter_flat(groups_.shard, r.output, r.input, comm::ReduceOp::kSum);
    ++stats_.reduce_scatters;
    stats_.comm_elements += comm::flat_collective_elements(flat.shard_numel, shard_size_);
  } else {
    r.output = r.input.scalar_type() == torch::kFloat32 ? r.input : r.input.to(torch::kFloat32);
  }
  reduction_bytes_ += r.input.nbytes();
  stats_.peak_reduction_bytes = std::max(stats_.peak_reduction_bytes, reduction_bytes_);
  pending_.push_back(std::move(r));
  settle_reductions(/*all=*/false);
}

// Starts the cross-replica all-reduce of every pending reduction whose shard-group part is done,
// in order (so every rank issues them alike); with `all`, waits for those parts first.
void FsdpState::launch_replica_reductions(bool all) {
  if (!groups_.replicate) return;
  for (auto& r : pending_) {
    if (r.replicate) continue;
    if (r.scatter) {
      if (!all && !r.scatter->isCompleted()) return;
      auto start = Clock::now();
      wait_or_throw(r.scatter, "a gradient reduce-scatter", shard_rank_, shard_size_);
      stats_.exposed_comm_ms += ms_since(start);
      r.scatter.reset();
    }
    std::vector<torch::Tensor> v{r.output};
    r.replicate = comm::all_reduce(groups_.replicate, v);
    ++stats_.all_reduces;
    stats_.comm_elements += 2 * r.output.numel() * (replicate_size_ - 1) / replicate_size_;
  }
}

void FsdpState::finalize_backward() {
  try {
    if (sync_this_backward_) {
      // Buffers whose parameters did not all get a gradient: the rest counts as zero.
      for (auto it = forward_order_.rbegin(); it != forward_order_.rend(); ++it)
        for (auto& flat : (*it)->flats)
          if (flat->trainable) reduce_flat(*flat);
      for (auto& flat : units_[0]->flats)
        if (flat->trainable) reduce_flat(*flat);
      for (auto& unit : units_)  // units that never ran forward (unused)
        for (auto& flat : unit->flats)
          if (flat->trainable) reduce_flat(*flat);
    }
    settle_reductions(/*all=*/true);
  } catch (...) {
    abandon_backward();
    throw;
  }
  for (auto& unit : units_) free_unit(*unit);
  backward_started_ = false;
  settled_this_backward_ = false;
}

// Note [Settling reductions]
// A flat gradient (padded_numel elements of the reduce dtype) must stay alive until the
// collective reading it completes. Keeping every unit's until the end of backward would hold the
// full model's gradients at once (FULL_SHARD's point is never to); so each new reduction first
// settles the ones already complete, oldest first, and, with more than kReductionsInFlight
// pending, waits for the oldest: at most kReductionsInFlight + 1 flat gradients are alive, just
// after one is issued. Settling a reduction averages its fp32 shard output into the shard's
// gradient and drops the flat gradient; the wait counts as exposed communication. Every rank
// issues the cross-replica all-reduces (HYBRID, NO_SHARD) in pending order, each at the latest
// before it is waited for. So a backward that fails part way has already added some units to
// the shards' gradients: abandon_backward drops every shard's gradient rather than leave a
// partial sum for the next optimizer step.
void FsdpState::settle_reductions(bool all) {
  launch_replica_reductions(all);
  torch::NoGradGuard no_grad;
  auto done = [](const c10::intrusive_ptr<c10d::Work>& w) { return !w || w->isCompleted(); };
  while (!pending_.empty()) {
    auto& r = pending_.front();
    const bool must = all || pending_.size() > kReductionsInFlight;
    const bool launched = !groups_.replicate || r.replicate;
    if (!must && !(launched && done(r.scatter) && done(r.replicate))) break;
    auto start = Clock::now();
    if (r.scatter) {
      wait_or_throw(r.scatter, "a gradient reduce-scatter", shard_rank_, shard_size_);
      r.scatter.reset();
    }
    if (!launched) launch_replica_reductions(/*all=*/false);  // the front's is next in order
    if (r.replicate) {
      wait_or_throw(r.replicate, "a gradient all-reduce across replicas", shard_rank_, shard_size_);
      r.replicate.reset();
    }
    stats_.exposed_comm_ms += ms_since(start);
    r.output.div_(groups_.world_size);
    auto& grad = r.flat->shard.mutable_grad();
    if (grad.defined())
      grad.add_(r.output);
    else
      grad = r.output.to(trainable_dtype_);  // itself when fp32; Note [Pure bf16]
    reduction_bytes_ -= r.input.nbytes();
    settled_this_backward_ = true;
    pending_.pop_front();
  }
}

void FsdpState::abandon_backward() {
  for (auto& r : pending_)
    for (auto* w : {&r.scatter, &r.replicate})
      if (*w) {
        try {
          (*w)->wait();
        } catch (const std::exception&) {
          // reported by the backward that launched it
        }
      }
  pending_.clear();
  reduction_bytes_ = 0;
  for (auto& unit : units_)
    for (auto& flat : unit->flats) {
      if (flat->grad_buffer.defined()) {  // the parameters' gradients are views of it
        for (auto& s : flat->slots) s.param.mutable_grad().reset();
        flat->grad_buffer.reset();
      }
      // Part of this backward's reductions reached the shards' gradients (Note [Settling
      // reductions]); no gradient is better than a partial one the next step would apply.
      if (settled_this_backward_ && flat->trainable) flat->shard.mutable_grad().reset();
    }
  settled_this_backward_ = false;
  for (auto& unit : units_) free_unit(*unit);
  backward_started_ = false;
}

}  // namespace trainyard::fsdp
