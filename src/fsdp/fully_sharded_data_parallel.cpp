#include "trainyard/fsdp/fully_sharded_data_parallel.h"

#include "fsdp/fsdp_state.h"

#include <torch/torch.h>

#include <algorithm>

#include "trainyard/comm/collectives.h"
#include "trainyard/error.h"
#include "trainyard/log.h"
#include "trainyard/memory/caching_allocator.h"
#include "trainyard/nn/grad_hooks.h"
#include "trainyard/nn/unit_hook.h"

namespace trainyard::fsdp {

// Note [FSDP lifecycle]
// A unit's parameters (its trainable ones, and apart from them its frozen ones) are laid out back
// to back in a flat buffer of padded_numel elements, a multiple of the shard group size S; rank r
// keeps elements [r * s, (r + 1) * s), s = padded_numel / S, as an fp32 leaf tensor (the shard)
// that the optimizer updates. The module's own parameter tensors keep their identity (the model
// code holds them), but their data is a view into one storage per flat buffer, `gathered`. A
// gather allocates that storage's memory in the compute dtype, writes the local shard into its
// slot and all-gathers the others; a free drops the memory (the storage keeps zero bytes). Tensors
// autograd saved in forward (the weights) share the storage, so gathering again before a unit's
// backward brings them back without autograd noticing.
//   forward of the root:   gather the root's parameters
//   a unit's forward:      gather (or wait for its prefetch), start the next unit's prefetch,
//                          run it (recomputably with activation checkpointing), free it again
//                          under FULL_SHARD, and hook its output's gradient (pre-backward)
//   pre-backward of unit:  gather it again, prefetch the unit whose backward comes next, point
//                          its parameters' .grad into a zeroed flat gradient buffer (Note
//                          [Gradients in place])
//   gradient hooks:        when every trainable parameter of a flat buffer has its gradient,
//                          reduce-scatter the flat gradient (in the reduce dtype), drop the
//                          parameters' .grad; a unit whose buffers are all reduced is freed;
//                          reductions already complete are averaged into shard.grad (Note
//                          [Settling reductions])
//   end of backward:       reduce what is left, wait for every reduction (and the all-reduce
//                          across replicas for NO_SHARD and HYBRID), free every unit
// Note [FSDP buffers]: on the CPU, the memory for gathered parameters, flat gradients and
// reduction outputs comes from trainyard's caching allocator whether or not init() made it
// LibTorch's (Note [Caching CPU allocator] in src/memory/caching_allocator.cpp): their sizes
// repeat every step, so after the first step they fault in no pages and fragment no heap. On a
// GPU it comes from LibTorch's caching allocator for the device, on the current stream.
// Every rank runs the same graph, so all ranks issue the same collectives in the same order,
// which Gloo and the shared-memory group require. A parameter that gets no gradient counts as a
// zero gradient, reduced at the end of backward.

// Note [Frozen shards]
// Frozen parameters (a LoRA base: models/lora.h) get no gradient and no optimizer step, so
// their shard needs no fp32 master copy: under mixed precision it is kept in the compute dtype
// (bf16: 2 bytes per parameter instead of 4), gathered as it is. PyTorch's FSDP1 cannot mix
// frozen and trainable parameters in one unit; here each unit keeps one flat buffer of each kind.
// With FsdpOptions::checkpoint_frozen false, sharded checkpoints leave the frozen buffers out:
// the model's source (its Hugging Face weights, or its seed) rebuilds them on every start.

// Note [Pure bf16]
// With MixedPrecision.shard_dtype bf16 the trainable shards themselves are bf16: the optimizer
// updates bf16 weights and keeps bf16 moments (FusedAdamW does so in one pass, computing each
// element in fp32 and rounding once), and no fp32 master copy exists: 2 + 2 bytes a sharded
// element for weight and gradient instead of 4 + 4, and 4 instead of 8 for Adam's moments. Only
// the reduction's output, one shard's worth, is fp32 (the collectives add in fp32); it is
// averaged, then rounded into the shard's bf16 gradient. The price is precision: an update
// smaller than half an ulp of its weight (2^-9 of it) is rounded away, so a small learning rate
// stalls sooner than under bf16-mixed. Checkpoints store fp32 (exact for bf16 values) and load
// into either kind of shard.

// Note [FSDP device]
// Everything FSDP allocates (shards, gathered parameters, flat gradients, reduction outputs,
// mixed-precision copies) lives on one device: FsdpOptions.device if set, else the parameters'
// device, on which every parameter with values must be (choose_device names one that is not). A
// deferred parameter, a CPU tensor without memory, joins any device: set_data() points it at
// the gathered storage there. Values made on the CPU (param_init, param_slice_init, a loaded
// checkpoint) are staged there and copied over; what FSDP hands out to be kept (full_parameters,
// the state dicts' files) is copied to the CPU. The collectives get tensors on the device
// (Note [Flat collectives on devices] in src/comm/collectives.cpp). FSDP creates no streams:
// its copies, casts and collectives are ordered on the current stream, and a collective's wait
// orders what follows after it. On the CPU every path is the one it always was.

// The engine's parts, each in its own file beside this one: units.cpp (choosing the units,
// building and sharding their flat buffers), forward.cpp (gathering, prefetching and freeing
// units; the forward pass), backward.cpp (gradient buffers, reductions, the end of backward).
// This file builds the engine, answers its queries and holds the public class.

class FsdpState::Hook : public nn::UnitHook {
 public:
  Hook(FsdpState* state, Unit* unit) : state_(state), unit_(unit) {}
  torch::Tensor run(torch::nn::Module&,
                    const torch::Tensor& input,
                    const nn::UnitForward& forward) override {
    return state_->run_unit(*unit_, input, forward);
  }

 private:
  FsdpState* state_;  // removes this hook in its destructor
  Unit* unit_;        // owned by the state
};

FsdpState::FsdpState(std::shared_ptr<torch::nn::Module> module,
                     FsdpGroups groups,
                     FsdpOptions options)
    : options_(std::move(options)), root_(std::move(module)), groups_(std::move(groups)) {
  TY_CHECK(root_ != nullptr, "FullyShardedDataParallel needs a module, got null.");
  if (groups_.shard) {
    shard_rank_ = groups_.shard->getRank();
    shard_size_ = groups_.shard->getSize();
  }
  if (groups_.replicate) replicate_size_ = groups_.replicate->getSize();
  TY_CHECK(groups_.world_size == shard_size_ * replicate_size_, "FsdpGroups.world_size is ",
           groups_.world_size, " but the shard group has ", shard_size_,
           " ranks and the replicate group ", replicate_size_,
           ". HINT: build the groups with make_fsdp_groups().");
  TY_CHECK(is_fsdp(options_.sharding), "FsdpOptions.sharding is ", to_string(options_.sharding),
           "; FSDP runs ", strategy_names(kFsdpStrategies), ".");
  const auto& mp = options_.mixed_precision;
  trainable_dtype_ = mp.shard_dtype.value_or(torch::kFloat32);
  compute_dtype_ = mp.param_dtype.value_or(trainable_dtype_);
  reduce_dtype_ = mp.reduce_dtype.value_or(compute_dtype_);
  for (auto dtype : {trainable_dtype_, compute_dtype_, reduce_dtype_})
    TY_CHECK(dtype == torch::kFloat32 || dtype == torch::kBFloat16,
             "FsdpOptions.mixed_precision: shard_dtype, param_dtype and reduce_dtype must be "
             "float32 or bfloat16, got ",
             dtype, ".");
  reshard_after_forward_ =
      options_.sharding == Strategy::kFullShard || options_.sharding == Strategy::kHybridShard;
  device_ = choose_device();

  select_units();

  std::vector<torch::Tensor> trainable;
  for (auto& unit : units_)
    for (auto& flat : unit->flats)
      if (flat->trainable)
        for (std::size_t i = 0; i < flat->slots.size(); ++i) {
          trainable.push_back(flat->slots[i].param);
          grad_index_.emplace_back(flat.get(), i);
        }
  grad_hooks_ = std::make_unique<nn::GradientHooks>(
      trainable, [this](std::size_t index) { on_gradient_ready(index); });
  for (std::size_t i = 1; i < units_.size(); ++i) {
    unit_hooks_.push_back(std::make_shared<Hook>(this, units_[i].get()));
    nn::set_unit_hook(*units_[i]->module, unit_hooks_.back());
  }
  if (mp.buffer_dtype || !device_.is_cpu()) {
    torch::NoGradGuard no_grad;
    for (auto& b : root_->buffers(/*recurse=*/true)) {
      if (!device_.is_cpu() && b.device() != device_) b.set_data(b.to(device_));  // deferred
      if (mp.buffer_dtype && b.is_floating_point()) b.set_data(b.to(*mp.buffer_dtype));
    }
  }
  logger("fsdp")->info(
      "FullyShardedDataParallel: {} units, {} parameter elements, shard group {} x replicas {}, "
      "{} bytes of sharded state on this rank",
      units_.size(),
      [&] {
        std::int64_t n = 0;
        for (auto& u : units_)
          for (auto& f : u->flats) n += f->numel;
        return n;
      }(),
      shard_size_, replicate_size_, sharded_state_bytes());
}

FsdpState::~FsdpState() {
  for (std::size_t i = 1; i < units_.size(); ++i) nn::set_unit_hook(*units_[i]->module, nullptr);
  try {
    abandon_backward();
  } catch (...) {
  }
}

std::string FsdpState::where() const {
  return detail::concat("FullyShardedDataParallel on rank ", shard_rank_, " of its shard group of ",
                        shard_size_);
}

// See Note [FSDP device].
torch::Device FsdpState::choose_device() const {
  std::optional<torch::Device> device = options_.device;
  TY_CHECK(!device || device->is_cpu() || device->has_index(),
           "FsdpOptions.device must name a device index, e.g. cuda:0 (the rank's LOCAL_RANK), "
           "got ",
           device.value_or(torch::kCPU), ".");
  std::string first;  // the parameter whose device it is, unless the options gave it
  for (const auto& item : root_->named_parameters(/*recurse=*/true)) {
    const auto& p = item.value();
    if (p.is_meta() || is_deferred(p)) continue;  // meta: build_flat says why it cannot be
    if (!device) {
      device = p.device();
      first = item.key();
      continue;
    }
    TY_CHECK(
        p.device() == *device, where(), ": parameter ", item.key(), " is on ", p.device(), ", but ",
        first.empty() ? std::string("FsdpOptions.device is ") : "parameter " + first + " is on ",
        *device,
        ". HINT: move the whole model to one device (model->to(device)) before wrapping it.");
  }
  return device.value_or(torch::kCPU);
}

torch::Tensor FsdpState::cached_buffer(std::int64_t numel, torch::ScalarType dtype) {
  if (!device_.is_cpu())
    return torch::empty({numel}, torch::TensorOptions().dtype(dtype).device(device_));
  const auto nbytes = static_cast<std::size_t>(numel) * c10::elementSize(dtype);
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes,
                       memory::caching_allocator()->allocate(nbytes), memory::caching_allocator(),
                       /*resizable=*/false);
  return view_of(storage, 0, {numel}, dtype);
}

at::DataPtr FsdpState::gathered_memory(std::size_t nbytes) {
  if (device_.is_cpu()) return memory::caching_allocator()->allocate(nbytes);
  // The memory of a fresh tensor, from the device's allocator, taken out of its storage.
  auto bytes = cached_buffer(static_cast<std::int64_t>(nbytes), torch::kUInt8);
  return bytes.storage().unsafeGetStorageImpl()->set_data_ptr(at::DataPtr(nullptr, device_));
}

std::vector<torch::Tensor> FsdpState::parameters() const {
  std::vector<torch::Tensor> out;
  for (auto& unit : units_)
    for (auto& flat : unit->flats)
      if (flat->trainable) out.push_back(flat->shard);
  return out;
}

double FsdpState::clip_grad_norm(double max_norm) {
  TY_CHECK(max_norm > 0, "clip_grad_norm_: max_norm must be > 0, got ", max_norm, ".");
  torch::NoGradGuard no_grad;
  // Padding is zero and every element lives in exactly one shard of the shard group (replicas
  // hold equal shards), so the squares summed over the shard group are the full gradient's.
  auto sum = torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat64).device(device_));
  for (auto& p : parameters())
    if (p.grad().defined()) sum += p.grad().to(torch::kFloat64).pow(2).sum();
  if (shard_size_ > 1) {
    std::vector<torch::Tensor> v{sum};
    wait_or_throw(comm::all_reduce(groups_.shard, v), "the gradient-norm all-reduce", shard_rank_,
                  shard_size_);
  }
  const double norm = std::sqrt(sum.item<double>());
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1)
    for (auto& p : parameters())
      if (p.grad().defined()) p.grad().mul_(coef);
  return norm;
}

std::vector<std::pair<std::string, torch::Tensor>> FsdpState::full_parameters(
    const std::optional<std::string>& unit_name) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  torch::NoGradGuard no_grad;
  bool found = false;
  for (auto& unit : units_) {
    if (unit_name && unit->name != *unit_name) continue;
    found = true;
    for (auto& flat : unit->flats) {
      // (padded_numel,) fp32 on device_, only this unit's
      auto full = torch::empty({flat->padded_numel},
                               torch::TensorOptions().dtype(torch::kFloat32).device(device_));
      if (shard_size_ > 1) {
        auto own = full.narrow(0, shard_rank_ * flat->shard_numel, flat->shard_numel);
        own.copy_(flat->shard);
        wait_or_throw(comm::all_gather_flat(groups_.shard, full, own), "gathering full parameters",
                      shard_rank_, shard_size_);
      } else {
        full.copy_(flat->shard);
      }
      const auto host = full.to(torch::kCPU);  // itself on the CPU: Note [FSDP device]
      for (auto& s : flat->slots)
        out.emplace_back(s.name, host.narrow(0, s.offset, s.numel).view(s.shape).clone());
    }
  }
  TY_CHECK(found, where(), ": full_parameters: no unit is named '", unit_name.value_or(""),
           "'. The units are listed by unit_names().");
  return out;
}

std::int64_t FsdpState::all_min(std::int64_t value) {
  auto t = torch::tensor({value}, torch::kInt64).to(device_);  // where the groups take it
  for (const auto& group : {groups_.shard, groups_.replicate}) {
    if (!group || group->getSize() == 1) continue;
    std::vector<torch::Tensor> v{t};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::MIN;
    wait_or_throw(comm::all_reduce(group, v, opts), "an agreement all-reduce", shard_rank_,
                  groups_.world_size);
  }
  return t.item<std::int64_t>();
}

void FsdpState::free_all() {
  TY_CHECK(!backward_started_, where(), ": its state cannot change during a backward pass.");
  for (auto& unit : units_) free_unit(*unit);
}

std::vector<std::string> FsdpState::unit_names() const {
  std::vector<std::string> names;
  for (auto& unit : units_) names.push_back(unit->name);
  return names;
}

std::int64_t FsdpState::sharded_state_bytes() const {
  std::int64_t bytes = 0;
  for (auto& unit : units_)
    for (auto& flat : unit->flats) {
      bytes += flat->shard.numel() * static_cast<std::int64_t>(flat->shard.element_size());
      if (flat->trainable && flat->shard.grad().defined())
        bytes += flat->shard.grad().numel() * static_cast<std::int64_t>(flat->shard.element_size());
    }
  return bytes;
}

// --- the public wrapper -------------------------------------------------------------------------

FullyShardedDataParallelBase::FullyShardedDataParallelBase(
    std::shared_ptr<torch::nn::Module> module, FsdpGroups groups, FsdpOptions options)
    : state_(
          std::make_unique<FsdpState>(std::move(module), std::move(groups), std::move(options))) {}

FullyShardedDataParallelBase::~FullyShardedDataParallelBase() = default;

std::vector<torch::Tensor> FullyShardedDataParallelBase::parameters() const {
  return state_->parameters();
}
double FullyShardedDataParallelBase::clip_grad_norm_(double max_norm) {
  return state_->clip_grad_norm(max_norm);
}
std::vector<std::pair<std::string, torch::Tensor>> FullyShardedDataParallelBase::full_parameters(
    const std::optional<std::string>& unit) {
  return state_->full_parameters(unit);
}
std::vector<std::string> FullyShardedDataParallelBase::unit_names() const {
  return state_->unit_names();
}
const FsdpStats& FullyShardedDataParallelBase::last_stats() const {
  return state_->stats_;
}
std::int64_t FullyShardedDataParallelBase::sharded_state_bytes() const {
  return state_->sharded_state_bytes();
}
const FsdpOptions& FullyShardedDataParallelBase::options() const {
  return state_->options_;
}
void FullyShardedDataParallelBase::pre_forward() {
  state_->pre_forward();
}
torch::Tensor FullyShardedDataParallelBase::post_forward(torch::Tensor output) {
  return state_->post_forward(std::move(output));
}

FullyShardedDataParallelBase::NoSyncGuard::NoSyncGuard(FullyShardedDataParallelBase& fsdp)
    : fsdp_(fsdp), previous_(fsdp.state_->require_sync_) {
  fsdp_.state_->require_sync_ = false;
}
FullyShardedDataParallelBase::NoSyncGuard::~NoSyncGuard() {
  fsdp_.state_->require_sync_ = previous_;
}

}  // namespace trainyard::fsdp
