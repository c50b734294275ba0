#include "trainyard/fsdp/fully_sharded_data_parallel.h"

#include "fsdp/fsdp_state.h"

#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <unordered_set>

#include "trainyard/comm/collectives.h"
#include "trainyard/comm/process_group.h"
#include "trainyard/comm/shm_process_group.h"
#include "trainyard/error.h"
#include "trainyard/heartbeat.h"
#include "trainyard/log.h"
#include "trainyard/memory/caching_allocator.h"
#include "trainyard/nn/checkpoint.h"
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

namespace {

using Clock = std::chrono::steady_clock;

// Reductions whose flat gradients may be in flight at once: Note [Settling reductions].
constexpr std::size_t kReductionsInFlight = 2;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// A parameter whose values do not exist yet: a CPU tensor with a shape but no memory (a model
// built for deferred initialisation).
bool is_deferred(const torch::Tensor& p) {
  return p.numel() > 0 && !p.is_meta() && p.storage().nbytes() == 0;
}

// A tensor of `shape` and `dtype` over `storage` (on its device) from element `offset`, not an
// autograd view.
torch::Tensor view_of(const c10::Storage& storage,
                      std::int64_t offset,
                      at::IntArrayRef shape,
                      torch::ScalarType dtype) {
  return torch::empty({0}, torch::TensorOptions().dtype(dtype).device(storage.device()))
      .set_(storage, offset, shape, c10::contiguous_strides(shape));
}

void wait_or_throw(const c10::intrusive_ptr<c10d::Work>& work,
                   const char* what,
                   int rank,
                   int world_size) {
  wait_collective(work, "FullyShardedDataParallel", what, rank,
                  world_size);  // beats: Note [Hang watchdog]
}

}  // namespace

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

// Innermost modules first: a unit claims the parameters of its subtree that no inner unit holds.
// See Note [FSDP lifecycle].
void FsdpState::select_units() {
  auto named = root_->named_modules("", /*include_self=*/false);
  std::unordered_set<const c10::TensorImpl*> claimed;
  std::vector<std::pair<std::string, std::vector<ParamSlot>>> found;  // innermost first
  std::vector<torch::nn::Module*> found_modules;
  for (std::size_t k = named.size(); k-- > 0;) {
    const auto& name = named[k].key();
    auto& module = *named[k].value();
    std::vector<ParamSlot> slots;
    std::int64_t numel = 0;
    for (auto& item : module.named_parameters(/*recurse=*/true)) {
      if (claimed.count(item.value().unsafeGetTensorImpl())) continue;
      slots.push_back(ParamSlot{.name = name + "." + item.key(), .param = item.value()});
      numel += item.value().numel();
    }
    if (numel == 0 || !options_.wrap.wraps || !options_.wrap.wraps(name, module, numel)) continue;
    for (auto& s : slots) claimed.insert(s.param.unsafeGetTensorImpl());
    found.emplace_back(name, std::move(slots));
    found_modules.push_back(&module);
  }
  for (const auto& required : options_.wrap.required_names) {
    bool ok =
        std::any_of(found.begin(), found.end(), [&](const auto& f) { return f.first == required; });
    TY_CHECK(ok, "FsdpOptions.wrap names module '", required,
             "' as a unit, but the model has no submodule of that name with parameters of its "
             "own. HINT: use the names named_modules() prints, e.g. 'gpt_neox.layers.0'.");
  }
  std::vector<ParamSlot> root_slots;
  for (auto& item : root_->named_parameters(/*recurse=*/true))
    if (!claimed.count(item.value().unsafeGetTensorImpl()))
      root_slots.push_back(ParamSlot{.name = item.key(), .param = item.value()});

  auto add_unit = [&](std::string name, torch::nn::Module* module, std::vector<ParamSlot> slots) {
    auto unit = std::make_unique<Unit>();
    unit->name = std::move(name);
    unit->module = module;
    std::vector<ParamSlot> trainable, frozen;
    for (auto& s : slots) (s.param.requires_grad() ? trainable : frozen).push_back(std::move(s));
    // One unit at a time: its full values exist only while its flat buffer is built.
    if (!trainable.empty()) build_flat(*unit, std::move(trainable), true);
    if (!frozen.empty()) {
      build_flat(*unit, std::move(frozen), false);
      unit->has_frozen = true;
    }
    units_.push_back(std::move(unit));
  };
  add_unit("", root_.get(), std::move(root_slots));
  for (std::size_t k = found.size(); k-- > 0;)  // outermost first: the order modules are declared
    add_unit(found[k].first, found_modules[k], std::move(found[k].second));
  // The units' full fp32 values existed only to be sharded: give their blocks back, or a 7B
  // model's largest units (a layer, the embeddings) stay mapped for the whole run.
  if (device_.is_cpu()) memory::release_idle_blocks();
}

void FsdpState::sync_initial_values(torch::Tensor& full) {
  // A model built on every rank (not deferred) may differ per rank; rank 0's values win, as in
  // DDP. Within the shard group, then across replicas from node 0.
  for (const auto& group : {groups_.shard, groups_.replicate}) {
    if (!group || group->getSize() == 1) continue;
    std::vector<torch::Tensor> v{full};
    c10d::BroadcastOptions opts;
    opts.rootRank = 0;
    wait_or_throw(comm::broadcast(group, v, opts), "broadcasting the initial parameters",
                  shard_rank_, groups_.world_size);
  }
}

void FsdpState::build_flat(Unit& unit, std::vector<ParamSlot> slots, bool trainable) {
  auto flat = std::make_unique<FlatParam>();
  flat->trainable = trainable;
  bool deferred = false;
  for (auto& s : slots) {
    TY_CHECK(!s.param.is_meta(), where(), ": parameter ", s.name,
             " is on the meta device, which LibTorch cannot turn into a CPU tensor in place. "
             "HINT: build the model for deferred initialisation (shapes without memory, e.g. "
             "GptNeoXInit{.deferred = true}) and give FsdpOptions.param_init.");
    TY_CHECK(s.param.scalar_type() == torch::kFloat32, where(), ": parameter ", s.name, " is ",
             s.param.scalar_type(),
             "; FSDP keeps fp32 shards and casts for compute (MixedPrecision.param_dtype). "
             "HINT: build the model in float32.");
    s.shape = s.param.sizes().vec();
    s.numel = s.param.numel();
    s.offset = flat->numel;
    flat->numel += s.numel;
    deferred = deferred || is_deferred(s.param);
  }
  flat->padded_numel = (flat->numel + shard_size_ - 1) / shard_size_ * shard_size_;
  flat->shard_numel = flat->padded_numel / shard_size_;

  torch::NoGradGuard no_grad;
  const auto dtype = shard_dtype(trainable);
  flat->aliases_shard = shard_size_ == 1 && compute_dtype_ == dtype;
  TY_CHECK(deferred || !options_.param_slice_init, where(),
           ": FsdpOptions.param_slice_init is set, but this unit's parameters already hold values "
           "(the model was not built deferred), so the slices would never be read. HINT: build "
           "the model deferred (e.g. GptNeoXInit{.deferred = true}), or leave param_slice_init "
           "unset.");
  if (deferred && options_.param_slice_init) {
    // Note [Initialising by slices]
    // Every parameter of a deferred unit is asked for the slice that falls in this rank's shard
    // (shard k holds the flat elements [k * shard_numel, (k + 1) * shard_numel)); padding stays
    // zero. The values are the same as param_init's, built without the unit's full buffer, and
    // every rank of a shard group reads disjoint slices.
    TY_CHECK(std::all_of(slots.begin(), slots.end(),
                         [](const ParamSlot& s) { return is_deferred(s.param); }),
             where(), ": FsdpOptions.param_slice_init needs every parameter of a unit deferred.");
    // CPU: Note [FSDP device]. A shard kept in bf16 (frozen: Note [Frozen shards]; pure bf16)
    // is staged in a reused buffer, so no fp32 copy of it stays behind in the heap.
    const bool staged = dtype != torch::kFloat32;
    auto shard = staged ? cached_buffer(flat->shard_numel, torch::kFloat32).zero_()
                        : torch::zeros({flat->shard_numel}, torch::kFloat32);
    const std::int64_t lo = shard_rank_ * flat->shard_numel, hi = lo + flat->shard_numel;
    for (const auto& s : slots) {
      const auto b = std::max(lo, s.offset), e = std::min(hi, s.offset + s.numel);
      if (b < e)
        options_.param_slice_init(s.name, b - s.offset, e - b, shard.data_ptr<float>() + (b - lo));
    }
    flat->shard = staged ? shard.to(device_, dtype, false, true) : shard.to(device_);
  } else {
    // (padded_numel,) fp32 on device_: the unit's full values, alive only here.
    auto full = cached_buffer(flat->padded_numel, torch::kFloat32).zero_();
    for (auto& s : slots) {
      auto dst = full.narrow(0, s.offset, s.numel).view(s.shape);
      if (is_deferred(s.param)) {
        TY_CHECK(options_.param_init != nullptr, where(), ": parameter ", s.name,
                 " has no values yet (deferred initialisation) and FsdpOptions.param_init is not "
                 "set. HINT: pass the model's initialiser, e.g. GptNeoXImpl::init_parameter.");
        auto t = torch::empty(s.shape, torch::kFloat32);  // CPU: Note [FSDP device]
        options_.param_init(s.name, t);
        dst.copy_(t);
      } else {
        dst.copy_(s.param.detach());
      }
    }
    if (!deferred) sync_initial_values(full);
    const auto own = full.narrow(0, shard_rank_ * flat->shard_numel, flat->shard_numel);
    flat->shard =
        flat->aliases_shard && dtype == torch::kFloat32 ? full : own.to(dtype, false, true);
  }
  if (flat->aliases_shard) {
    flat->gathered = flat->shard.storage();
    flat->is_gathered = true;
  } else if (device_.is_cpu()) {
    flat->gathered = c10::Storage(c10::Storage::use_byte_size_t(),
                                  flat->padded_numel * c10::elementSize(compute_dtype_),
                                  c10::GetCPUAllocator(), /*resizable=*/true);
  } else {
    flat->gathered = cached_buffer(flat->padded_numel, compute_dtype_).storage();
  }
  flat->shard.set_requires_grad(trainable);
  for (auto& s : slots)
    s.param.set_data(view_of(flat->gathered, s.offset, s.shape, compute_dtype_));
  flat->slots = std::move(slots);
  auto* raw = flat.get();
  unit.flats.push_back(std::move(flat));
  if (!raw->aliases_shard) {
    raw->is_gathered = true;  // the storage has memory until freed below
    gathered_bytes_ += raw->gathered.nbytes();
    free_unit(unit);
  }
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

// --- groups ------------------------------------------------------------------------------------

FsdpGroups make_fsdp_groups(Strategy strategy,
                            const c10::intrusive_ptr<c10d::ProcessGroup>& world,
                            const c10::intrusive_ptr<c10d::Store>& store,
                            int local_world_size,
                            const std::string& master_addr) {
  TY_CHECK(world, "make_fsdp_groups needs a process group, got null.");
  const int w = world->getSize();
  const int rank = world->getRank();
  switch (strategy) {
    case Strategy::kFullShard:
    case Strategy::kShardGradOp:
      return FsdpGroups{.shard = world, .replicate = {}, .world_size = w};
    case Strategy::kNoShard:
      return FsdpGroups{.shard = {},
                        .replicate = w > 1 ? world : c10::intrusive_ptr<c10d::ProcessGroup>(),
                        .world_size = w};
    case Strategy::kHybridShard:
    case Strategy::kHybridShardGradOp:
      break;
    case Strategy::kDdp:
    case Strategy::kZero1:
      throw InvalidArgumentError(detail::concat(
          "FSDP's sharding strategy is ", to_string(strategy), ", which is not one of FSDP's (",
          strategy_names(kFsdpStrategies),
          "). HINT: wrap the model in DistributedDataParallel for ", to_string(strategy),
          strategy == Strategy::kZero1 ? " and shard Adam's state with ShardedAdam." : "."));
  }
  TY_CHECK(local_world_size >= 1 && w % local_world_size == 0,
           "HYBRID sharding needs the world size (", w,
           ") to be a multiple of the ranks per node (LOCAL_WORLD_SIZE = ", local_world_size,
           "). HINT: start the same number of ranks on every node (--nproc-per-node).");
  TY_CHECK(store, "make_fsdp_groups: HYBRID sharding needs the job's store to form groups.");
  const int node = rank / local_world_size;
  const int local = rank % local_world_size;
  const int nodes = w / local_world_size;
  FsdpGroups groups{.world_size = w};
  if (local_world_size > 1) {
    auto node_store =
        c10::make_intrusive<c10d::PrefixStore>("fsdp/node/" + std::to_string(node), store);
    auto gloo = make_gloo_group(node_store, local, local_world_size, {}, master_addr);
    groups.shard = make_local_group(node_store, local, local_world_size, gloo);
  }
  if (nodes > 1) {
    auto replica_store =
        c10::make_intrusive<c10d::PrefixStore>("fsdp/replica/" + std::to_string(local), store);
    groups.replicate = make_gloo_group(replica_store, node, nodes, {}, master_addr);
  }
  return groups;
}

FsdpGroups groups_from(const std::shared_ptr<Distributed>& dist, Strategy strategy) {
  TY_CHECK(dist != nullptr, "FullyShardedDataParallel needs a Distributed (trainyard::init()).");
  return make_fsdp_groups(strategy, dist->process_group(), dist->store(),
                          dist->env().local_world_size, dist->env().master_addr);
}

WrapPolicy wrap_by_parameter_count(std::int64_t min_numel) {
  TY_CHECK(min_numel > 0, "wrap_by_parameter_count: min_numel must be > 0, got ", min_numel, ".");
  return {.wraps = [min_numel](const std::string&, const torch::nn::Module&, std::int64_t n) {
    return n >= min_numel;
  }};
}

WrapPolicy wrap_modules_named(std::vector<std::string> names) {
  std::unordered_set<std::string> set(names.begin(), names.end());
  return {.wraps = [set](const std::string& name, const torch::nn::Module&,
                         std::int64_t) { return set.count(name) > 0; },
          .required_names = std::move(names)};
}

WrapPolicy wrap_any_of(std::vector<WrapPolicy> policies) {
  WrapPolicy out;
  for (const auto& p : policies)
    out.required_names.insert(out.required_names.end(), p.required_names.begin(),
                              p.required_names.end());
  out.wraps = [policies = std::move(policies)](
                  const std::string& name, const torch::nn::Module& module, std::int64_t numel) {
    return std::any_of(policies.begin(), policies.end(), [&](const WrapPolicy& p) {
      return p.wraps && p.wraps(name, module, numel);
    });
  };
  return out;
}

}  // namespace trainyard::fsdp
