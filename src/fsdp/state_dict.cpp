#include "trainyard/fsdp/state_dict.h"

#include <torch/torch.h>

#include <cinttypes>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "fsdp/fsdp_state.h"
#include "trainyard/checkpoint/checkpointer.h"
#include "trainyard/checkpoint/multi_writer_save.h"
#include "trainyard/checkpoint/safetensors.h"
#include "trainyard/error.h"
#include "trainyard/hf/dtype.h"
#include "trainyard/log.h"
#include "trainyard/optim/state_key.h"
#include "trainyard/storage/storage.h"

namespace trainyard::fsdp {

// Note [Sharded state]
// A flat buffer's elements [k * s, (k + 1) * s) are shard k's (Note [FSDP lifecycle]). Its
// parameters lie back to back, so shard k holds one contiguous slice [begin, end) of the
// flattened elements of each parameter it overlaps. A sharded file stores exactly those slices,
// as 1-D fp32 tensors named after the parameter, with the optimizer's state of the same elements
// beside them ("<name>::exp_avg", "<name>::exp_avg_sq", "<name>::momentum_buffer"); padding is
// never stored. fsdp.json lists every parameter's shape and, per file, the slice of each
// parameter it holds. A loading rank computes the slices its own shards need from its own layout
// (any world size, strategy or wrap policy), reads only the files that overlap them and copies
// the overlap, so nothing is converted offline and no rank reads more than the files its
// elements are in. Replicas (HYBRID, NO_SHARD) hold equal shards: the first one writes.
// Everything is staged and checked before the live shards change, so a failed load changes
// nothing and the ranks can agree to fall back to an older checkpoint together. Files hold CPU
// tensors: saving copies slices of the shards (on FSDP's device) to the CPU, loading stages on
// the CPU and copies onto the device when applying (Note [FSDP device]).

namespace {

constexpr int kFormatVersion = 1;
constexpr const char* kShardedFormat = "trainyard-fsdp-sharded";
constexpr const char* kFullFormat = "trainyard-fsdp-full";

// Whether a sharded checkpoint holds `flat` (Note [Frozen shards]).
bool checkpointed(const FsdpState& st, const FlatParam& flat) {
  return flat.trainable || st.options_.checkpoint_frozen;
}

// A slice of one parameter inside one shard.
struct Piece {
  const ParamSlot* slot;
  std::int64_t begin;  // elements of the flattened parameter
  std::int64_t end;
  std::int64_t shard_offset;  // where `begin` sits in the shard
  std::int64_t size() const { return end - begin; }
};

std::vector<Piece> pieces_of(const FlatParam& flat, int shard_rank) {
  const std::int64_t lo = shard_rank * flat.shard_numel, hi = lo + flat.shard_numel;
  std::vector<Piece> out;
  for (const auto& s : flat.slots) {
    const auto b = std::max(lo, s.offset), e = std::min(hi, s.offset + s.numel);
    if (b < e) out.push_back({&s, b - s.offset, e - s.offset, b - lo});
  }
  return out;
}

std::string shard_file_name(int shard, int shards) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard_%05d_of_%05d.safetensors", shard, shards);
  return buf;
}

std::string full_file_name(int k, int n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", k, n);
  return buf;
}

// --- optimizer state ---------------------------------------------------------------------------

std::string optimizer_kind(torch::optim::Optimizer* opt) {
  if (opt == nullptr) return "none";
  if (dynamic_cast<torch::optim::AdamW*>(opt)) return "adamw";
  if (dynamic_cast<torch::optim::Adam*>(opt)) return "adam";
  if (dynamic_cast<torch::optim::SGD*>(opt)) return "sgd";
  throw InvalidArgumentError(
      "FSDP state dicts know the state of Adam, AdamW (and FusedAdam, FusedAdamW) and SGD; this "
      "optimizer is none of them. HINT: save its state yourself, or use one of those.");
}

optim::OptimizerStateKey state_key(const torch::Tensor& p) {
  return optim::optimizer_state_key(p);
}

struct ShardOptState {
  std::int64_t step = 0;
  std::vector<std::pair<std::string, torch::Tensor>> tensors;  // each (shard_numel,)
};

template <typename S>
ShardOptState adam_state(const S& a) {
  ShardOptState out{.step = a.step(),
                    .tensors = {{"exp_avg", a.exp_avg()}, {"exp_avg_sq", a.exp_avg_sq()}}};
  if (a.max_exp_avg_sq().defined()) out.tensors.emplace_back("max_exp_avg_sq", a.max_exp_avg_sq());
  return out;
}

// The optimizer's state of `shard`; nullopt before its first step.
std::optional<ShardOptState> optimizer_state(torch::optim::Optimizer& opt,
                                             const torch::Tensor& shard) {
  auto it = opt.state().find(state_key(shard));
  if (it == opt.state().end()) return std::nullopt;
  auto* base = it->second.get();
  if (auto* a = dynamic_cast<torch::optim::AdamWParamState*>(base)) return adam_state(*a);
  if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(base)) return adam_state(*a);
  if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(base)) {
    ShardOptState out;
    if (s->momentum_buffer().defined())
      out.tensors.emplace_back("momentum_buffer", s->momentum_buffer());
    return out;
  }
  return std::nullopt;
}

template <typename S>
std::unique_ptr<S> make_adam_state(std::int64_t step, std::map<std::string, torch::Tensor>& t) {
  auto s = std::make_unique<S>();
  s->step(step);
  s->exp_avg(t.at("exp_avg"));
  s->exp_avg_sq(t.at("exp_avg_sq"));
  if (t.count("max_exp_avg_sq")) s->max_exp_avg_sq(t.at("max_exp_avg_sq"));
  return s;
}

void set_optimizer_state(torch::optim::Optimizer& opt,
                         const std::string& kind,
                         const torch::Tensor& shard,
                         std::int64_t step,
                         std::map<std::string, torch::Tensor>& tensors) {
  const auto key = state_key(shard);
  if (kind == "none" || tensors.empty()) {
    opt.state().erase(key);
  } else if (kind == "adamw") {
    opt.state()[key] = make_adam_state<torch::optim::AdamWParamState>(step, tensors);
  } else if (kind == "adam") {
    opt.state()[key] = make_adam_state<torch::optim::AdamParamState>(step, tensors);
  } else {
    auto s = std::make_unique<torch::optim::SGDParamState>();
    s->momentum_buffer(tensors.at("momentum_buffer"));
    opt.state()[key] = std::move(s);
  }
}

std::vector<std::string> state_names(const std::string& kind) {
  if (kind == "adam" || kind == "adamw") return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  if (kind == "sgd") return {"momentum_buffer"};
  return {};
}

// --- staging ------------------------------------------------------------------------------------

// New values for one of this rank's flat buffers, (shard_numel,) fp32 each, padding zero.
struct StagedFlat {
  FlatParam* flat;
  torch::Tensor values;
  std::map<std::string, torch::Tensor> optimizer;
};

struct Staged {
  std::vector<StagedFlat> flats;
  std::string optimizer_kind = "none";  // of the state staged
  std::int64_t optimizer_step = 0;
};

// Where this rank's elements come from: per file, the pieces that file may hold.
struct Need {
  StagedFlat* staged;
  Piece piece;
  std::int64_t filled = 0;
  std::map<std::string, std::int64_t> filled_state;
};

Staged staged_for(FsdpState& st) {
  Staged staged;
  for (const auto& unit : st.units())
    for (const auto& flat : unit->flats)
      if (checkpointed(st, *flat))
        staged.flats.push_back(
            {flat.get(), torch::zeros({flat->shard_numel}, torch::kFloat32), {}});
  return staged;
}

std::vector<Need> needs_of(FsdpState& st, Staged& staged) {
  std::vector<Need> needs;
  for (auto& sf : staged.flats)
    for (const auto& piece : pieces_of(*sf.flat, st.shard_rank())) needs.push_back({&sf, piece});
  return needs;
}

[[noreturn]] void corrupt(const std::string& what, const std::string& message) {
  throw CheckpointCorruptError(detail::concat(what, ": ", message));
}

nlohmann::json parse_json(const std::string& text, const std::string& what) {
  try {
    return nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    corrupt(what, detail::concat("not valid JSON (", e.what(), ")."));
  }
}

// fsdp.json's "strategy": the FSDP strategy the checkpoint was saved under.
Strategy parse_saved_strategy(const nlohmann::json& meta, const std::string& what) {
  const std::string meta_what = what + "/" + kShardedMetadataFile;
  try {
    return parse_strategy(meta.at("strategy").get<std::string>(), kFsdpStrategies, "\"strategy\"");
  } catch (const nlohmann::json::exception& e) {
    corrupt(meta_what, detail::concat("malformed (", e.what(), ")."));
  } catch (const InvalidArgumentError& e) {
    corrupt(meta_what, e.what());
  }
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Every model parameter is in `saved` with its shape, and nothing else is. A mismatch is the
// caller's (another model or config), not damage: InvalidArgumentError.
void check_parameters(FsdpState& st,
                      const std::map<std::string, std::vector<std::int64_t>>& saved,
                      const std::string& what) {
  std::set<std::string> extra;
  for (const auto& [name, shape] : saved) extra.insert(name);
  for (const auto& unit : st.units())
    for (const auto& flat : unit->flats)
      for (const auto& s : flat->slots) {
        if (!checkpointed(st, *flat)) continue;
        auto it = saved.find(s.name);
        TY_CHECK(it != saved.end(), what, " has no parameter ", s.name,
                 ". HINT: was it saved from another model or config?");
        TY_CHECK(it->second == s.shape, what, ": parameter ", s.name, " has shape ",
                 shape_text(it->second), " there but ", shape_text(s.shape), " in this model.");
        extra.erase(s.name);
      }
  TY_CHECK(extra.empty(), what, " holds ", extra.size(), " parameters this model lacks, e.g. ",
           extra.empty() ? "" : *extra.begin(), ".");
}

void check_filled(const std::vector<Need>& needs,
                  const std::string& kind,
                  const std::string& what) {
  for (const auto& n : needs) {
    if (n.filled != n.piece.size())
      corrupt(what, detail::concat("no file holds all of elements [", n.piece.begin, ", ",
                                   n.piece.end, ") of ", n.piece.slot->name, " (found ", n.filled,
                                   "): a shard file is missing from it."));
    if (!n.staged->flat->trainable || (kind != "adam" && kind != "adamw")) continue;
    for (const char* state : {"exp_avg", "exp_avg_sq"}) {
      auto it = n.filled_state.find(state);
      if (it == n.filled_state.end() || it->second != n.piece.size())
        corrupt(what, detail::concat("the optimizer's ", state, " of ", n.piece.slot->name,
                                     " is missing or incomplete (was the parameter frozen when "
                                     "it was saved?)."));
    }
  }
}

Staged stage_sharded(FsdpState& st,
                     torch::optim::Optimizer* opt,
                     const std::string& metadata_text,
                     const FileReader& read,
                     const std::string& what) {
  const std::string meta_what = what + "/" + kShardedMetadataFile;
  const auto meta = parse_json(metadata_text, meta_what);
  if (!meta.is_object() || meta.value("format", "") != kShardedFormat ||
      meta.value("version", 0) != kFormatVersion)
    corrupt(meta_what,
            detail::concat("not a version-", kFormatVersion, " ", kShardedFormat, " description."));
  std::map<std::string, std::vector<std::int64_t>> shapes;
  std::map<std::string, std::map<std::string, std::pair<std::int64_t, std::int64_t>>> files;
  std::string kind;
  std::int64_t step = 0;
  try {
    for (const auto& [name, p] : meta.at("parameters").items())
      shapes[name] = p.at("shape").get<std::vector<std::int64_t>>();
    for (const auto& [file, ranges] : meta.at("files").items())
      for (const auto& [name, r] : ranges.items())
        files[file][name] = {r.at(0).get<std::int64_t>(), r.at(1).get<std::int64_t>()};
    kind = meta.at("optimizer").at("kind").get<std::string>();
    step = meta.at("optimizer").value("step", std::int64_t{0});
  } catch (const nlohmann::json::exception& e) {
    corrupt(meta_what, detail::concat("malformed (", e.what(), ")."));
  }
  check_parameters(st, shapes, what);
  Staged staged = staged_for(st);
  if (opt != nullptr && kind != "none") {
    const auto mine = optimizer_kind(opt);
    TY_CHECK(mine == kind, what, " holds ", kind, " optimizer state, but the optimizer given is ",
             mine, ". HINT: resume with the optimizer the run was saved with.");
    staged.optimizer_kind = kind;
    staged.optimizer_step = step;
  }
  auto needs = needs_of(st, staged);
  for (const auto& [file, ranges] : files) {
    std::vector<std::pair<Need*, std::pair<std::int64_t, std::int64_t>>> hits;
    for (auto& n : needs) {
      auto it = ranges.find(n.piece.slot->name);
      if (it == ranges.end()) continue;
      const auto [fb, fe] = it->second;
      if (std::max(fb, n.piece.begin) < std::min(fe, n.piece.end)) hits.push_back({&n, {fb, fe}});
    }
    if (hits.empty()) continue;  // none of this rank's elements are in it: not read
    const std::string bytes = read(file);
    const checkpoint::SafetensorsView view(bytes, what + "/" + file);
    for (auto& [need, range] : hits) {
      const auto [fb, fe] = range;
      const auto& piece = need->piece;
      const auto b = std::max(fb, piece.begin), e = std::min(fe, piece.end);
      auto copy_into = [&](torch::Tensor& dst, const std::string& key) {
        auto src = view.tensor(key);
        TY_CHECK_T(CheckpointCorruptError, src.dim() == 1 && src.numel() == fe - fb, view.what(),
                   ": ", key, " has ", src.numel(), " elements; fsdp.json says ", fe - fb, ".");
        dst.narrow(0, piece.shard_offset + b - piece.begin, e - b)
            .copy_(src.narrow(0, b - fb, e - b));
      };
      const auto& name = piece.slot->name;
      copy_into(need->staged->values, name);
      need->filled += e - b;
      if (staged.optimizer_kind == "none" || !need->staged->flat->trainable) continue;
      for (const auto& state : state_names(kind)) {
        if (!view.contains(name + "::" + state)) continue;
        auto& dst = need->staged->optimizer[state];
        if (!dst.defined()) dst = torch::zeros({need->staged->flat->shard_numel}, torch::kFloat32);
        copy_into(dst, name + "::" + state);
        need->filled_state[state] += e - b;
      }
    }
  }
  check_filled(needs, staged.optimizer_kind, what);
  return staged;
}

Staged stage_full(FsdpState& st, const FileReader& read, const std::string& what) {
  const std::string index_what = what + "/" + kFullIndexFile;
  const auto index = parse_json(read(kFullIndexFile), index_what);
  std::map<std::string, std::string> weight_map;
  try {
    weight_map = index.at("weight_map").get<std::map<std::string, std::string>>();
  } catch (const nlohmann::json::exception& e) {
    corrupt(index_what, detail::concat("malformed (", e.what(), ")."));
  }
  Staged staged = staged_for(st);
  auto needs = needs_of(st, staged);
  std::map<std::string, std::vector<Need*>> by_file;
  for (auto& n : needs) {
    auto it = weight_map.find(n.piece.slot->name);
    TY_CHECK(it != weight_map.end(), index_what, " has no parameter ", n.piece.slot->name,
             ". HINT: was it saved from another model or config?");
    by_file[it->second].push_back(&n);
  }
  for (const auto& [file, file_needs] : by_file) {
    const std::string bytes = read(file);
    const checkpoint::SafetensorsView view(bytes, what + "/" + file);
    for (auto* n : file_needs) {
      const auto& s = *n->piece.slot;
      auto t = view.tensor(s.name);
      TY_CHECK(t.sizes().vec() == s.shape, view.what(), ": ", s.name, " has shape ",
               shape_text(t.sizes().vec()), " but ", shape_text(s.shape), " in this model.");
      n->staged->values.narrow(0, n->piece.shard_offset, n->piece.size())
          .copy_(t.reshape({-1}).narrow(0, n->piece.begin, n->piece.size()));
      n->filled = n->piece.size();
    }
  }
  return staged;
}

void apply(FsdpState& st, torch::optim::Optimizer* opt, Staged& staged) {
  st.free_all();
  torch::NoGradGuard no_grad;
  for (auto& sf : staged.flats) {
    sf.flat->shard.copy_(sf.values);
    // Staged on the CPU in fp32; the moments take the shard's dtype (Note [Pure bf16]).
    for (auto& [name, t] : sf.optimizer)
      t = t.to(sf.flat->shard.device(), sf.flat->shard.scalar_type());
    if (opt != nullptr && sf.flat->trainable)
      set_optimizer_state(*opt, staged.optimizer_kind, sf.flat->shard, staged.optimizer_step,
                          sf.optimizer);
  }
}

}  // namespace

// --- sharded -----------------------------------------------------------------------------------

std::optional<std::pair<std::string, std::string>> sharded_state_file(
    FullyShardedDataParallelBase& fsdp, torch::optim::Optimizer* optimizer) {
  auto& st = fsdp.state();
  if (st.replicate_rank() != 0) return std::nullopt;
  optimizer_kind(optimizer);  // refuses an optimizer whose state it cannot save
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  nlohmann::json ranges = nlohmann::json::object();
  for (const auto& unit : st.units())
    for (const auto& flat : unit->flats) {
      if (!checkpointed(st, *flat)) continue;
      std::optional<ShardOptState> state;
      if (optimizer != nullptr && flat->trainable) state = optimizer_state(*optimizer, flat->shard);
      for (const auto& piece : pieces_of(*flat, st.shard_rank())) {
        auto slice = [&](const torch::Tensor& t) {  // on the CPU: Note [Sharded state]
          // In the shard's dtype: fp32, or bf16 (a frozen shard; Note [Pure bf16]), which loads
          // into either kind of shard. No fp32 copy of a bf16 shard's state is made to save it.
          return t.detach().narrow(0, piece.shard_offset, piece.size()).to(torch::kCPU);
        };
        const auto& name = piece.slot->name;
        tensors.emplace_back(name, slice(flat->shard));
        ranges[name] = {piece.begin, piece.end};
        if (state)
          for (const auto& [key, t] : state->tensors)
            tensors.emplace_back(name + "::" + key, slice(t));
      }
    }
  return std::pair{shard_file_name(st.shard_rank(), st.shard_size()),
                   checkpoint::encode_safetensors(
                       tensors, {{"format", kShardedFormat}, {"ranges", ranges.dump()}})};
}

std::string sharded_state_metadata(FullyShardedDataParallelBase& fsdp,
                                   torch::optim::Optimizer* optimizer) {
  auto& st = fsdp.state();
  nlohmann::json params = nlohmann::json::object();
  nlohmann::json files = nlohmann::json::object();
  nlohmann::json opt = {{"kind", "none"}};
  for (int k = 0; k < st.shard_size(); ++k)
    files[shard_file_name(k, st.shard_size())] = nlohmann::json::object();
  for (const auto& unit : st.units())
    for (const auto& flat : unit->flats) {
      if (!checkpointed(st, *flat)) continue;
      for (const auto& s : flat->slots)
        params[s.name] = {{"shape", s.shape}, {"trainable", flat->trainable}, {"unit", unit->name}};
      for (int k = 0; k < st.shard_size(); ++k)
        for (const auto& piece : pieces_of(*flat, k))
          files[shard_file_name(k, st.shard_size())][piece.slot->name] = {piece.begin, piece.end};
      if (optimizer == nullptr || !flat->trainable || opt["kind"] != "none") continue;
      if (auto state = optimizer_state(*optimizer, flat->shard))
        opt = {{"kind", optimizer_kind(optimizer)}, {"step", state->step}};
    }
  const nlohmann::json meta = {
      {"format", kShardedFormat},
      {"version", kFormatVersion},
      {"world_size", st.world_size()},
      {"shard_group_size", st.shard_size()},
      {"replicas", st.replicate_size()},
      {"strategy", to_string(fsdp.options().sharding)},
      {"optimizer", opt},
      {"parameters", params},
      {"files", files},
  };
  return meta.dump(1);
}

void load_sharded_state(FullyShardedDataParallelBase& fsdp,
                        torch::optim::Optimizer* optimizer,
                        const std::string& metadata,
                        const FileReader& read) {
  auto staged = stage_sharded(fsdp.state(), optimizer, metadata, read, "the sharded state");
  apply(fsdp.state(), optimizer, staged);
}

// --- full --------------------------------------------------------------------------------------

void write_full_state(FullyShardedDataParallelBase& fsdp, const FileWriter& write) {
  auto& st = fsdp.state();
  const bool writer = st.global_rank() == 0;
  int files = 0;
  for (const auto& unit : st.units()) files += unit->flats.empty() ? 0 : 1;
  nlohmann::json weight_map = nlohmann::json::object();
  std::int64_t total_bytes = 0;
  std::exception_ptr failed;  // the writer keeps gathering with the others after a failure
  int k = 0;
  for (const auto& unit : st.units()) {
    if (unit->flats.empty()) continue;
    auto params = fsdp.full_parameters(unit->name);  // collective: this unit only
    if (!writer || failed) continue;
    const auto file = full_file_name(++k, files);
    for (const auto& [name, t] : params) {
      weight_map[name] = file;
      total_bytes += t.numel() * 4;
    }
    try {
      write(file, checkpoint::encode_safetensors(params, {{"format", "pt"}}));
    } catch (...) {
      failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
  if (!writer) return;
  const nlohmann::json index = {
      {"metadata", {{"total_size", total_bytes}, {"format", kFullFormat}}},
      {"weight_map", weight_map}};
  write(kFullIndexFile, index.dump(2) + "\n");
}

void load_full_state(FullyShardedDataParallelBase& fsdp, const FileReader& read) {
  auto staged = stage_full(fsdp.state(), read, "the full state");
  apply(fsdp.state(), nullptr, staged);
}

// --- checkpoints -------------------------------------------------------------------------------

std::string save_checkpoint(FullyShardedDataParallelBase& fsdp,
                            torch::optim::Optimizer* optimizer,
                            checkpoint::Checkpointer& checkpointer,
                            c10d::Store& store,
                            std::int64_t step,
                            const std::map<std::string, std::string>& extra,
                            CheckpointFormat format) {
  auto& st = fsdp.state();
  const bool first = st.global_rank() == 0;
  checkpoint::MultiWriterSave save(checkpointer, store, st.global_rank(), st.world_size());
  if (format == CheckpointFormat::kSharded) {
    if (auto file = sharded_state_file(fsdp, optimizer)) save.write(file->first, file->second);
    if (first) save.write(kShardedMetadataFile, sharded_state_metadata(fsdp, optimizer));
  } else {
    write_full_state(fsdp,
                     [&](const std::string& file, std::string bytes) { save.write(file, bytes); });
  }
  if (first)
    for (const auto& [file, bytes] : extra) save.write(file, bytes);
  return save.commit(step);
}

std::optional<LoadedFsdpCheckpoint> load_latest_checkpoint(
    FullyShardedDataParallelBase& fsdp,
    torch::optim::Optimizer* optimizer,
    checkpoint::Checkpointer& checkpointer,
    const std::vector<std::string>& extra_files) {
  auto& st = fsdp.state();
  auto log = logger("fsdp");
  std::int64_t bound = std::numeric_limits<std::int64_t>::max();
  for (;;) {
    // The newest checkpoint below `bound` that every rank sees.
    std::int64_t mine = -1;
    const auto names = checkpointer.list_complete();
    for (auto it = names.rbegin(); it != names.rend() && mine < 0; ++it) {
      const auto n = checkpoint::checkpoint_number(*it);
      if (n < bound) mine = n;
    }
    const std::int64_t chosen = st.all_min(mine);
    if (chosen < 0) return std::nullopt;
    const std::string name = checkpoint::checkpoint_name(chosen);
    const std::string what = storage::join_uri(checkpointer.storage().uri(), name);

    // Stage: read, verify and copy this rank's elements; nothing live changes yet.
    enum Badness { kOk = 0, kCorrupt = 1, kFailed = 2 };
    int badness = kOk;
    std::string error;
    Staged staged;
    LoadedFsdpCheckpoint out{.name = name};
    try {
      const auto manifest = checkpointer.read_manifest(name);
      auto read = [&](const std::string& file) { return checkpointer.read_file(manifest, file); };
      out.step = manifest.step;
      if (manifest.files.count(kShardedMetadataFile)) {
        const auto meta_text = read(kShardedMetadataFile);
        staged = stage_sharded(st, optimizer, meta_text, read, what);
        const auto meta = nlohmann::json::parse(meta_text);
        out.saved_world_size = meta.value("world_size", 0);
        out.saved_strategy = parse_saved_strategy(meta, what);
      } else if (manifest.files.count(kFullIndexFile)) {
        out.format = CheckpointFormat::kFull;
        staged = stage_full(st, read, what);
      } else {
        corrupt(what, detail::concat("it holds neither ", kShardedMetadataFile, " nor ",
                                     kFullIndexFile, ": not an FSDP checkpoint."));
      }
      for (const auto& file : extra_files) out.extra[file] = read(file);
    } catch (const CheckpointCorruptError& e) {
      badness = kCorrupt;
      error = e.what();
    } catch (const std::exception& e) {
      badness = kFailed;
      error = e.what();
    }

    // Agree: the worst any rank found decides for all.
    const int worst = static_cast<int>(-st.all_min(-badness));
    if (worst == kOk) {
      apply(st, optimizer, staged);
      if (st.global_rank() == 0) {
        if (out.format == CheckpointFormat::kSharded)
          log->info("Resumed from {} (step {}), saved by {} ranks ({}), loaded on {} ({}){}", what,
                    out.step, out.saved_world_size, to_string(*out.saved_strategy), st.world_size(),
                    to_string(fsdp.options().sharding),
                    out.saved_world_size != st.world_size() ||
                            out.saved_strategy != fsdp.options().sharding
                        ? ": resharded on load"
                        : "");
        else
          log->info(
              "Resumed from {} (step {}), a full checkpoint{}", what, out.step,
              optimizer ? "; the optimizer starts fresh (full checkpoints hold parameters)" : "");
      }
      return out;
    }
    if (worst == kFailed) {
      throw Error(
          badness == kFailed
              ? detail::concat("Rank ", st.global_rank(), " could not read ", what, ": ", error)
              : detail::concat("Loading ", what, " failed on another rank (its log says why)."));
    }
    if (badness == kCorrupt) {
      log->warn("Rank {} cannot load {}; trying the one before it: {}", st.global_rank(), name,
                error);
      checkpointer.mark_damaged(name, detail::concat("rank ", st.global_rank(), ": ", error));
    } else {
      log->warn("Skipping {}: another rank found it damaged (its log says why).", name);
    }
    bound = chosen;
  }
}

}  // namespace trainyard::fsdp

namespace trainyard::fsdp {

// Note [Reading parameters by ranges]
// A sharded file is a safetensors file of 1-D fp32 slices (Note [Sharded state]). Its first 8
// bytes give the header's length; the header gives each slice's byte range. The reader reads
// those two once per file and then each slice's bytes alone, so a 7B checkpoint's parameter is
// assembled from a few ranged reads (pread on a file system, a Range GET on S3) and the files,
// optimizer moments included, are never held. Ranges cannot be checked against the manifest's
// SHA-256 of whole files, so the reader's callers (generate, export) first stream each file
// through the hash (Checkpointer::verify_file) and reject, or fall back past, a checkpoint that
// fails it, as a resume does; each header's extent is checked against the manifest's size too.
struct ShardedParameterReader::Impl {
  struct Slice {
    std::string file;
    std::int64_t begin = 0, end = 0;   // elements of the flattened parameter
    std::uint64_t offset = 0;          // bytes into the file
    hf::Dtype dtype = hf::Dtype::F32;  // as saved: F32, or BF16 (a bf16 shard's)
  };
  struct Extent {
    std::uint64_t begin = 0, end = 0;  // bytes from the file's start
    hf::Dtype dtype = hf::Dtype::F32;
  };
  RangeReader read;
  std::string what;
  std::map<std::string, std::vector<std::int64_t>> shapes;
  std::map<std::string, std::vector<Slice>> slices;

  [[noreturn]] void corrupt(const std::string& file, const std::string& why) const {
    throw CheckpointCorruptError(detail::concat(what, "/", file, ": ", why));
  }

  // name -> its bytes and dtype, from the file's header.
  std::map<std::string, Extent> header_of(const std::string& file, std::uint64_t file_bytes) const {
    const auto prefix = read(file, 0, 8);
    if (prefix.size() != 8) corrupt(file, "shorter than a safetensors header.");
    std::uint64_t n = 0;
    for (int i = 0; i < 8; ++i)
      n |= std::uint64_t(static_cast<unsigned char>(prefix[i])) << (8 * i);
    if (n > file_bytes - 8)
      corrupt(file, detail::concat("the header length ", n, " exceeds the file."));
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(read(file, 8, n));
    } catch (const std::exception& e) {
      corrupt(file, detail::concat("the header is not JSON (", e.what(), ")."));
    }
    std::map<std::string, Extent> out;
    std::uint64_t extent = 8 + n;
    for (const auto& [name, info] : header.items()) {
      if (name == "__metadata__") continue;
      try {
        const auto dtype = hf::parse_dtype(info.at("dtype").get<std::string>());
        if (dtype != hf::Dtype::F32 && dtype != hf::Dtype::BF16)
          corrupt(file, "tensor " + name + " is neither F32 nor BF16.");
        const auto r = info.at("data_offsets").get<std::vector<std::uint64_t>>();
        if (r.size() != 2 || r[1] < r[0]) corrupt(file, "tensor " + name + "'s data_offsets.");
        out[name] = {8 + n + r[0], 8 + n + r[1], *dtype};
        extent = std::max(extent, 8 + n + r[1]);
      } catch (const nlohmann::json::exception& e) {
        corrupt(file, detail::concat("tensor ", name, ": ", e.what()));
      }
    }
    if (extent != file_bytes)
      corrupt(file, detail::concat("the header describes ", extent, " bytes but the manifest ",
                                   file_bytes, "."));
    return out;
  }
};

ShardedParameterReader::ShardedParameterReader(const std::string& metadata,
                                               RangeReader read,
                                               std::map<std::string, std::uint64_t> file_bytes,
                                               std::string what)
    : impl_(std::make_unique<Impl>()) {
  impl_->read = std::move(read);
  impl_->what = std::move(what);
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(metadata);
    TY_CHECK_T(CheckpointCorruptError, meta.at("format") == kShardedFormat, impl_->what, "/",
               kShardedMetadataFile, " is not a sharded FSDP state.");
    for (const auto& item : meta.at("parameters").items())
      impl_->shapes[item.key()] = item.value().at("shape").get<std::vector<std::int64_t>>();
    for (const auto& file : meta.at("files").items()) {
      if (file.value().empty()) continue;
      auto bytes = file_bytes.find(file.key());
      TY_CHECK_T(CheckpointCorruptError, bytes != file_bytes.end(), impl_->what, " has no file ",
                 file.key(), ", which ", kShardedMetadataFile, " lists.");
      const auto header = impl_->header_of(file.key(), bytes->second);
      for (const auto& slice : file.value().items()) {
        const auto range = slice.value().get<std::vector<std::int64_t>>();
        auto entry = header.find(slice.key());
        if (entry == header.end() || range.size() != 2 ||
            entry->second.end - entry->second.begin !=
                static_cast<std::uint64_t>(range[1] - range[0]) *
                    hf::element_size(entry->second.dtype))
          impl_->corrupt(file.key(), "the slice of \"" + slice.key() + "\" does not match " +
                                         kShardedMetadataFile + ".");
        impl_->slices[slice.key()].push_back(
            {file.key(), range[0], range[1], entry->second.begin, entry->second.dtype});
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointCorruptError(
        detail::concat(impl_->what, "/", kShardedMetadataFile, " is malformed: ", e.what()));
  }
}

ShardedParameterReader::~ShardedParameterReader() = default;

const std::map<std::string, std::vector<std::int64_t>>& ShardedParameterReader::shapes() const {
  return impl_->shapes;
}

void ShardedParameterReader::read(const std::string& name, float* dst) const {
  auto shape = impl_->shapes.find(name);
  TY_CHECK_T(CheckpointCorruptError, shape != impl_->shapes.end(), impl_->what,
             " has no parameter \"", name, "\".");
  std::int64_t numel = 1;
  for (auto d : shape->second) numel *= d;
  std::int64_t covered = 0;
  auto it = impl_->slices.find(name);
  if (it != impl_->slices.end()) {
    for (const auto& s : it->second) {
      const auto count = static_cast<std::size_t>(s.end - s.begin);
      const auto bytes = count * hf::element_size(s.dtype);
      const auto data = impl_->read(s.file, s.offset, bytes);
      if (data.size() != bytes)
        impl_->corrupt(s.file, "the slice of \"" + name + "\" is cut short.");
      hf::convert(data.data(), s.dtype, dst + s.begin, hf::Dtype::F32, count);
      covered += s.end - s.begin;
    }
  }
  TY_CHECK_T(CheckpointCorruptError, covered == numel, impl_->what, ": the files hold ", covered,
             " of the ", numel, " elements of \"", name, "\".");
}

void load_sharded_into_module(torch::nn::Module& module,
                              const ShardedParameterReader& reader,
                              const std::string& what) {
  auto named = module.named_parameters();
  for (const auto& [name, shape] : reader.shapes())
    TY_CHECK_T(CheckpointCorruptError, named.contains(name), what, " holds parameter \"", name,
               "\", which the model has not. HINT: was it saved from another model?");
  torch::NoGradGuard no_grad;
  for (auto& p : named) {
    auto it = reader.shapes().find(p.key());
    // A frozen parameter a checkpoint leaves out keeps the module's value (Note [Frozen shards]).
    if (it == reader.shapes().end() && !p.value().requires_grad()) continue;
    TY_CHECK_T(CheckpointCorruptError, it != reader.shapes().end(), what, " has no parameter \"",
               p.key(), "\".");
    TY_CHECK_T(CheckpointCorruptError, torch::IntArrayRef(it->second) == p.value().sizes(), what,
               ": parameter \"", p.key(), "\" has shape ", torch::IntArrayRef(it->second),
               " there but ", p.value().sizes(), " in the model.");
    auto full = torch::empty({p.value().numel()}, torch::kFloat32);
    reader.read(p.key(), full.data_ptr<float>());
    p.value().copy_(full.view(p.value().sizes()));
  }
}

}  // namespace trainyard::fsdp
