// Choosing FSDP's units and building each unit's flat buffers: the parameters laid out back to
// back, the initial values sharded (Note [FSDP lifecycle] in fully_sharded_data_parallel.cpp).
#include "fsdp/fsdp_state.h"

#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include <algorithm>
#include <unordered_set>

#include "trainyard/comm/collectives.h"
#include "trainyard/error.h"
#include "trainyard/memory/caching_allocator.h"

namespace trainyard::fsdp {

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
  const bool deferred = lay_out(*flat, slots);

  torch::NoGradGuard no_grad;
  const auto dtype = shard_dtype(trainable);
  flat->aliases_shard = shard_size_ == 1 && compute_dtype_ == dtype;
  TY_CHECK(deferred || !options_.param_slice_init, where(),
           ": FsdpOptions.param_slice_init is set, but this unit's parameters already hold values "
           "(the model was not built deferred), so the slices would never be read. HINT: build "
           "the model deferred (e.g. GptNeoXInit{.deferred = true}), or leave param_slice_init "
           "unset.");
  if (deferred && options_.param_slice_init)
    shard_from_slices(*flat, slots);
  else
    shard_from_full_values(*flat, slots, deferred);
  make_gathered_storage(*flat);
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

bool FsdpState::lay_out(FlatParam& flat, std::vector<ParamSlot>& slots) const {
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
    s.offset = flat.numel;
    flat.numel += s.numel;
    deferred = deferred || is_deferred(s.param);
  }
  flat.padded_numel = (flat.numel + shard_size_ - 1) / shard_size_ * shard_size_;
  flat.shard_numel = flat.padded_numel / shard_size_;
  return deferred;
}

void FsdpState::shard_from_slices(FlatParam& flat, const std::vector<ParamSlot>& slots) {
  // Note [Initialising by slices]
  // Every parameter of a deferred unit is asked for the slice that falls in this rank's shard
  // (shard k holds the flat elements [k * shard_numel, (k + 1) * shard_numel)); padding stays
  // zero. The values are the same as param_init's, built without the unit's full buffer, and
  // every rank of a shard group reads disjoint slices.
  TY_CHECK(std::all_of(slots.begin(), slots.end(),
                       [](const ParamSlot& s) { return is_deferred(s.param); }),
           where(), ": FsdpOptions.param_slice_init needs every parameter of a unit deferred.");
  const auto dtype = shard_dtype(flat.trainable);
  // CPU: Note [FSDP device]. A shard kept in bf16 (frozen: Note [Frozen shards]; pure bf16)
  // is staged in a reused buffer, so no fp32 copy of it stays behind in the heap.
  const bool staged = dtype != torch::kFloat32;
  auto shard = staged ? cached_buffer(flat.shard_numel, torch::kFloat32).zero_()
                      : torch::zeros({flat.shard_numel}, torch::kFloat32);
  const std::int64_t lo = shard_rank_ * flat.shard_numel, hi = lo + flat.shard_numel;
  for (const auto& s : slots) {
    const auto b = std::max(lo, s.offset), e = std::min(hi, s.offset + s.numel);
    if (b < e)
      options_.param_slice_init(s.name, b - s.offset, e - b, shard.data_ptr<float>() + (b - lo));
  }
  flat.shard = staged ? shard.to(device_, dtype, false, true) : shard.to(device_);
}

void FsdpState::shard_from_full_values(FlatParam& flat,
                                       const std::vector<ParamSlot>& slots,
                                       bool deferred) {
  const auto dtype = shard_dtype(flat.trainable);
  // (padded_numel,) fp32 on device_: the unit's full values, alive only here.
  auto full = cached_buffer(flat.padded_numel, torch::kFloat32).zero_();
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
  const auto own = full.narrow(0, shard_rank_ * flat.shard_numel, flat.shard_numel);
  flat.shard = flat.aliases_shard && dtype == torch::kFloat32 ? full : own.to(dtype, false, true);
}

void FsdpState::make_gathered_storage(FlatParam& flat) {
  if (flat.aliases_shard) {
    flat.gathered = flat.shard.storage();
    flat.is_gathered = true;
  } else if (device_.is_cpu()) {
    flat.gathered = c10::Storage(c10::Storage::use_byte_size_t(),
                                 flat.padded_numel * c10::elementSize(compute_dtype_),
                                 c10::GetCPUAllocator(), /*resizable=*/true);
  } else {
    flat.gathered = cached_buffer(flat.padded_numel, compute_dtype_).storage();
  }
}

}  // namespace trainyard::fsdp
