#include "trainyard/ddp/reducer.h"

#include <torch/torch.h>

#include <chrono>
#include <sstream>

#include "trainyard/comm/collectives.h"
#include "trainyard/comm/process_group.h"
#include "trainyard/comm/shm_process_group.h"
#include "trainyard/error.h"
#include "trainyard/heartbeat.h"
#include "trainyard/log.h"
#include "trainyard/nn/grad_hooks.h"

namespace trainyard::ddp {

// Note [Bucket order]
// Gradients become ready roughly in reverse registration order (the last layer's first), so
// buckets are filled from the last parameter backwards. Gloo matches collectives by the order in
// which ranks issue them, so buckets are launched strictly in index order: a full bucket waits
// for every earlier bucket to launch first. Every rank therefore issues the same sequence of
// all-reduces even when its gradients land in a different order, or some never land (unused
// parameters are zero-filled at the end of backward, then the remaining buckets launch in order).

// Note [Gradients as bucket views]
// After the first synchronised backward, each parameter's .grad is a view into its bucket. The
// autograd engine then accumulates later gradients in place, straight into the bucket, so the
// hooks copy nothing and the averaged result needs no copy back. Optimizers zero gradients in
// place (LibTorch's zero_grad()), which keeps the views. Code that replaces .grad with another
// tensor only costs the copy again: stage_gradient() notices and the next finalize re-views.

struct DdpReducer::Bucket {
  torch::Tensor flat;               // (numel,) gradients laid out back to back
  std::vector<std::size_t> params;  // indices into params_
  std::size_t pending = 0;          // gradients still missing in this backward
  c10::intrusive_ptr<c10d::Work> work;
};

namespace {

std::string join_names(const std::vector<std::string>& names, std::size_t limit = 10) {
  std::ostringstream out;
  for (std::size_t i = 0; i < names.size() && i < limit; ++i) out << (i ? ", " : "") << names[i];
  if (names.size() > limit) out << " and " << names.size() - limit << " more";
  return out.str();
}

void wait_or_throw(const c10::intrusive_ptr<c10d::Work>& work,
                   const char* what,
                   int rank,
                   int world_size) {
  wait_collective(work, "DistributedDataParallel", what, rank,
                  world_size);  // beats: Note [Hang watchdog]
}

}  // namespace

DdpReducer::DdpReducer(std::shared_ptr<torch::nn::Module> module,
                       c10::intrusive_ptr<c10d::ProcessGroup> process_group,
                       DdpOptions options)
    : module_(std::move(module)), pg_(std::move(process_group)), options_(options) {
  TY_CHECK(module_ != nullptr, "DistributedDataParallel needs a module, got null.");
  TY_CHECK(pg_, "DistributedDataParallel needs a process group, got null.");
  TY_CHECK(options_.bucket_size_bytes > 0, "DdpOptions.bucket_size_bytes must be > 0, got ",
           options_.bucket_size_bytes, ".");
  TY_CHECK(options_.first_bucket_size_bytes > 0,
           "DdpOptions.first_bucket_size_bytes must be > 0, got ", options_.first_bucket_size_bytes,
           ".");
  rank_ = pg_->getRank();
  world_size_ = pg_->getSize();
  const auto caps = comm::capabilities_of(pg_);
  average_in_collective_ = caps.average_in_collective;
  device_group_ = caps.device_tensors;

  for (auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    params_.push_back(item.value());
    param_names_.push_back(item.key());
  }
  TY_CHECK(!params_.empty(), "DistributedDataParallel: the module has no trainable parameters.");

  verify_layout_across_ranks();
  {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> state(params_.begin(), params_.end());
    for (auto& b : module_->buffers(/*recurse=*/true)) state.push_back(b);
    broadcast_from_rank0(state);
  }
  build_buckets();

  hooks_ = std::make_unique<nn::GradientHooks>(
      params_, [this](std::size_t index) { on_gradient_ready(index); });
  ready_.assign(params_.size(), false);

  logger("ddp")->info(
      "DistributedDataParallel: {} parameters in {} buckets (cap {} MiB), world size {}",
      params_.size(), buckets_.size(), options_.bucket_size_bytes >> 20, world_size_);
}

DdpReducer::~DdpReducer() = default;

void DdpReducer::verify_layout_across_ranks() {
  if (world_size_ == 1) return;
  std::int64_t numel = 0;
  for (auto& p : params_) numel += p.numel();
  // (2,): the parameter count and element count; equal on all ranks iff min == max.
  auto local = torch::tensor({static_cast<std::int64_t>(params_.size()), numel}, torch::kInt64);
  auto lo = local.clone();
  auto hi = local.clone();
  std::vector<torch::Tensor> lo_v{lo}, hi_v{hi};
  c10d::AllreduceOptions min_op, max_op;
  min_op.reduceOp = c10d::ReduceOp::MIN;
  max_op.reduceOp = c10d::ReduceOp::MAX;
  wait_or_throw(comm::all_reduce(pg_, lo_v, min_op), "the parameter layout check", rank_,
                world_size_);
  wait_or_throw(comm::all_reduce(pg_, hi_v, max_op), "the parameter layout check", rank_,
                world_size_);
  TY_CHECK(torch::equal(lo, hi), "DistributedDataParallel: ranks hold different models. Rank ",
           rank_, " has ", params_.size(), " trainable parameters with ", numel,
           " elements; across ranks the counts range over [", lo[0].item<int64_t>(), ", ",
           hi[0].item<int64_t>(), "] and the elements over [", lo[1].item<int64_t>(), ", ",
           hi[1].item<int64_t>(), "]. HINT: build the same model on every rank.");
}

void DdpReducer::broadcast_from_rank0(const std::vector<torch::Tensor>& tensors) {
  if (world_size_ == 1 || tensors.empty()) return;
  // Coalesce by dtype: one broadcast per dtype instead of one per tensor.
  std::map<c10::ScalarType, std::vector<torch::Tensor>> by_dtype;
  for (const auto& t : tensors) by_dtype[t.scalar_type()].push_back(t);
  for (auto& [dtype, group] : by_dtype) {
    std::vector<torch::Tensor> flat{at::flatten_dense_tensors(group)};
    c10d::BroadcastOptions opts;
    opts.rootRank = 0;
    wait_or_throw(comm::broadcast(pg_, flat, opts), "broadcasting state from rank 0", rank_,
                  world_size_);
    if (rank_ == 0) continue;
    auto parts = at::unflatten_dense_tensors(flat[0], group);
    for (std::size_t i = 0; i < group.size(); ++i) group[i].copy_(parts[i]);
  }
}

void DdpReducer::build_buckets() {
  bucket_of_param_.assign(params_.size(), 0);
  offset_of_param_.assign(params_.size(), 0);
  // See Note [Bucket order]: walk parameters from the last registered to the first.
  std::map<c10::ScalarType, std::size_t> open;        // index of the bucket being filled, per dtype
  std::map<c10::ScalarType, std::size_t> open_bytes;  // bytes already in it
  std::vector<std::int64_t> numel_of_bucket;
  for (std::size_t k = params_.size(); k-- > 0;) {
    const auto& p = params_[k];
    auto dtype = p.scalar_type();
    std::size_t bytes = p.numel() * p.element_size();
    std::size_t cap =
        buckets_.size() <= 1 ? options_.first_bucket_size_bytes : options_.bucket_size_bytes;
    auto it = open.find(dtype);
    if (it == open.end() || (open_bytes[dtype] > 0 && open_bytes[dtype] + bytes > cap)) {
      buckets_.push_back(std::make_unique<Bucket>());
      numel_of_bucket.push_back(0);
      it = open.insert_or_assign(dtype, buckets_.size() - 1).first;
      open_bytes[dtype] = 0;
    }
    auto& b = *buckets_[it->second];
    b.params.push_back(k);
    bucket_of_param_[k] = it->second;
    offset_of_param_[k] = numel_of_bucket[it->second];
    numel_of_bucket[it->second] += p.numel();
    open_bytes[dtype] += bytes;
  }
  for (auto& b : buckets_) {
    std::int64_t numel = 0;
    for (auto j : b->params) numel += params_[j].numel();
    // In shared memory under a ShmProcessGroup: see Note [Collectives in place].
    b->flat = allocate_collective_buffer(pg_, numel,
                                         params_[b->params.front()].options().requires_grad(false));
    b->pending = b->params.size();
  }
}

void DdpReducer::prepare_forward() {
  if (backward_started_) {
    // The last backward failed before its end-of-backward callback ran (the engine drops queued
    // callbacks of a failed graph): settle what it launched and start clean.
    logger("ddp")->warn("the previous backward pass did not finish; discarding its all-reduces");
    abandon_backward();
  }
  sync_this_backward_ = require_sync_;
  if (options_.broadcast_buffers && world_size_ > 1 && module_->is_training()) sync_buffers();
}

void DdpReducer::sync_buffers() {
  if (world_size_ == 1) return;
  torch::NoGradGuard no_grad;
  broadcast_from_rank0(module_->buffers(/*recurse=*/true));
}

void DdpReducer::abandon_backward() {
  // Launched all-reduces still write into the buckets (the gradients): wait them out first.
  for (auto& b : buckets_) {
    if (!b->work) continue;
    try {
      b->work->wait();
    } catch (const std::exception&) {
      // The error was or will be reported by the backward that launched it.
    }
  }
  reset_backward_state();
}

void DdpReducer::on_gradient_ready(std::size_t index) {
  heartbeat();  // a gradient is progress inside the step, one rank or many: Note [Hang watchdog]
  if (!sync_this_backward_ || world_size_ == 1) return;
  if (!backward_started_) {
    backward_started_ = true;
    launched_in_backward_ = 0;
    nn::queue_end_of_backward([this] { finalize_backward(); });
  }
  TY_CHECK(!ready_[index], "DistributedDataParallel: parameter ", param_names_[index],
           " received its gradient twice in one backward pass. HINT: a module reused in a loop "
           "or a second backward through the same graph needs no_sync() for all but the last.");
  ready_[index] = true;
  auto& bucket = *buckets_[bucket_of_param_[index]];
  stage_gradient(index);
  --bucket.pending;
  launch_ready_buckets(/*from_hook=*/true);
}

// See Note [Gradients as bucket views].
// The slot aliases the bucket's storage without being an autograd view: optimizers' zero_grad()
// calls detach_() on gradients, which autograd refuses for views.
torch::Tensor DdpReducer::bucket_view(std::size_t index) const {
  const auto& flat = buckets_[bucket_of_param_[index]]->flat;
  const auto& p = params_[index];
  return torch::empty({0}, flat.options())
      .set_(flat.storage(), offset_of_param_[index], p.sizes(), c10::contiguous_strides(p.sizes()));
}

void DdpReducer::stage_gradient(std::size_t index) {
  auto slot = bucket_view(index);
  const auto& grad = params_[index].grad();
  if (!grad.defined()) {
    slot.zero_();
  } else if (grad.data_ptr() != slot.data_ptr()) {
    slot.copy_(grad);
  }  // else the gradient already lives in the bucket
}

void DdpReducer::launch_ready_buckets(bool from_hook) {
  // See Note [Bucket order].
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_]->pending == 0) {
    auto& b = *buckets_[next_bucket_];
    std::vector<torch::Tensor> tensors{b.flat};
    c10d::AllreduceOptions opts;
    // On a group with a GPU backend, AVG is that backend's (NCCL); CPU buckets go through Gloo.
    const bool average_here = average_in_collective_ && (!device_group_ || b.flat.is_cuda());
    if (average_here && b.flat.is_floating_point() && b.flat.element_size() >= 4) {
      opts.reduceOp = c10d::ReduceOp::AVG;  // scaled inside the reduction pass
    } else {
      b.flat.div_(world_size_);  // Gloo has no AVG (nor the shm group below float32)
    }
    b.work = comm::all_reduce(pg_, tensors, opts);
    if (from_hook) ++launched_in_backward_;
    ++next_bucket_;
  }
}

void DdpReducer::finalize_backward() {
  std::vector<std::size_t> missing;
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (!ready_[i]) missing.push_back(i);

  if (!missing.empty() && !options_.find_unused_parameters) {
    std::vector<std::string> names;
    for (auto i : missing) names.push_back(param_names_[i]);
    abandon_backward();
    throw Error(detail::concat(
        "DistributedDataParallel on rank ", rank_, "/", world_size_, ": ", missing.size(),
        " parameter(s) received no gradient in this backward pass: ", join_names(names),
        ". The other ranks' all-reduces cannot complete without them. HINT: construct DDP with "
        "DdpOptions{.find_unused_parameters = true}, or exclude these parameters from the "
        "module (requires_grad(false))."));
  }

  // (P,): 1 where this rank produced a gradient, summed across ranks below.
  torch::Tensor used;
  if (options_.find_unused_parameters) {
    used = torch::ones({static_cast<std::int64_t>(params_.size())}, torch::kInt32);
    auto used_acc = used.accessor<int, 1>();
    for (auto i : missing) {
      used_acc[i] = 0;
      stage_gradient(i);  // zero, or what no_sync passes accumulated
      --buckets_[bucket_of_param_[i]]->pending;
    }
  }
  launch_ready_buckets(/*from_hook=*/false);
  TY_ASSERT(next_bucket_ == buckets_.size(), "not every bucket launched");
  c10::intrusive_ptr<c10d::Work> used_work;
  if (used.defined()) {
    std::vector<torch::Tensor> v{used};
    used_work = comm::all_reduce(pg_, v);
  }

  const auto wait_start = std::chrono::steady_clock::now();
  try {
    for (auto& b : buckets_) wait_or_throw(b->work, "a gradient all-reduce", rank_, world_size_);
    if (used_work) wait_or_throw(used_work, "the unused-parameter all-reduce", rank_, world_size_);
  } catch (...) {
    abandon_backward();
    throw;
  }

  torch::NoGradGuard no_grad;
  const int* used_count = used.defined() ? used.data_ptr<int>() : nullptr;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    // A parameter no rank used keeps no gradient, exactly as in a single process.
    if (used_count != nullptr && used_count[i] == 0) continue;
    params_[i].mutable_grad() = bucket_view(i);
  }
  stats_ = DdpStepStats{.bucket_count = bucket_count(),
                        .buckets_launched_in_backward = launched_in_backward_,
                        .locally_unused_parameters = static_cast<int>(missing.size()),
                        .exposed_comm_ms = std::chrono::duration<double, std::milli>(
                                               std::chrono::steady_clock::now() - wait_start)
                                               .count()};
  logger("ddp")->debug(
      "backward: {} of {} buckets launched from hooks, {:.1f} ms waiting at the end",
      stats_.buckets_launched_in_backward, stats_.bucket_count, stats_.exposed_comm_ms);
  reset_backward_state();
}

void DdpReducer::reset_backward_state() {
  std::fill(ready_.begin(), ready_.end(), false);
  for (auto& b : buckets_) {
    b->pending = b->params.size();
    b->work.reset();
  }
  next_bucket_ = 0;
  backward_started_ = false;
}

}  // namespace trainyard::ddp
