// FSDP state dicts and checkpoints. Two formats, both safetensors files (checkpoint/safetensors.h)
// with Hugging Face's parameter names:
//  - sharded: each rank writes the elements it holds (parameters and the optimizer's state of
//    them) as its own file, plus fsdp.json describing every file's slices. No collective, no full
//    copy anywhere. Loading reads only the files that overlap this rank's shards, so a sharded
//    checkpoint loads at any world size and strategy (Note [Sharded state] in state_dict.cpp).
//  - full: the whole model in fp32, gathered one unit at a time and written by one rank as
//    Hugging Face's sharded layout (model-00001-of-00013.safetensors, ...,
//    model.safetensors.index.json); never more than one unit gathered. Parameters only.
//
//   checkpoint::Checkpointer ckpt(uri);                  // every rank, same job instance
//   fsdp::save_checkpoint(model, &opt, ckpt, *dist->store(), step, {{"state.json", text}});
//   auto resumed = fsdp::load_latest_checkpoint(model, &opt, ckpt, {"state.json"});
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trainyard/fsdp/fully_sharded_data_parallel.h"

namespace c10d {
class Store;
}
namespace torch::optim {
class Optimizer;
}
namespace trainyard::checkpoint {
class Checkpointer;
}

namespace trainyard::fsdp {

// The file fsdp.json in a sharded checkpoint, and the index of a full one.
inline constexpr const char* kShardedMetadataFile = "fsdp.json";
inline constexpr const char* kFullIndexFile = "model.safetensors.index.json";

// Returns the bytes of a checkpoint's file; throws (CheckpointCorruptError) when it cannot.
using FileReader = std::function<std::string(const std::string& file)>;
using FileWriter = std::function<void(const std::string& file, std::string bytes)>;

// This rank's file of a sharded state: its name and bytes. nullopt on a rank whose shards another
// replica writes (HYBRID beyond the first node, NO_SHARD beyond rank 0). `optimizer` (may be null)
// must be over fsdp.parameters(): Adam, AdamW (and the fused ones) or SGD. Local.
std::optional<std::pair<std::string, std::string>> sharded_state_file(
    FullyShardedDataParallelBase& fsdp, torch::optim::Optimizer* optimizer);
// fsdp.json: the world it was saved at and which slice of which parameter each file holds. The
// same on every rank; local.
std::string sharded_state_metadata(FullyShardedDataParallelBase& fsdp,
                                   torch::optim::Optimizer* optimizer);
// Loads a sharded state saved at any world size and strategy, reading through `read` only the
// files holding this rank's elements. The optimizer's state is restored when both the checkpoint
// and `optimizer` have one (an optimizer of another kind is an error). Local. Throws
// CheckpointCorruptError naming the file, or the parameter missing or of another shape; on a
// throw, fsdp and optimizer are unchanged.
void load_sharded_state(FullyShardedDataParallelBase& fsdp,
                        torch::optim::Optimizer* optimizer,
                        const std::string& metadata,
                        const FileReader& read);

// The full model's parameters in fp32, one unit gathered at a time; `write` is called on global
// rank 0 only, for each file. Collective.
void write_full_state(FullyShardedDataParallelBase& fsdp, const FileWriter& write);
// Loads a full state (or any safetensors weights with an index, e.g. a Hugging Face directory's)
// with this model's parameter names and shapes. Local; throws like load_sharded_state.
void load_full_state(FullyShardedDataParallelBase& fsdp, const FileReader& read);

// Loads a sharded state's parameters into an unwrapped `module` with the same parameter names and
// shapes (for generation and export in one process): each parameter is assembled from its slices,
// one at a time; every file is read once. `what` names the checkpoint in errors
// (CheckpointCorruptError: a parameter missing on either side, a shape or slice that disagrees).
void load_sharded_into_module(torch::nn::Module& module,
                              const std::string& metadata,
                              const FileReader& read,
                              const std::string& what);

enum class CheckpointFormat { kSharded, kFull };

// Saves the model (and for kSharded, the optimizer's state) and `extra` files (written by rank 0,
// e.g. the training position) into a new checkpoint that every rank writes its part of
// (checkpoint::MultiWriterSave over `store`). Collective; every rank passes its own Checkpointer
// on the run's folder. Returns the checkpoint's name on every rank, or throws on every rank.
std::string save_checkpoint(FullyShardedDataParallelBase& fsdp,
                            torch::optim::Optimizer* optimizer,
                            checkpoint::Checkpointer& checkpointer,
                            c10d::Store& store,
                            std::int64_t step,
                            const std::map<std::string, std::string>& extra = {},
                            CheckpointFormat format = CheckpointFormat::kSharded);

struct LoadedFsdpCheckpoint {
  std::string name;  // "checkpoint_000004"
  std::int64_t step = 0;
  CheckpointFormat format = CheckpointFormat::kSharded;
  int saved_world_size = 0;                  // 0 for a full checkpoint
  std::string saved_strategy;                // "full_shard", ...; empty for a full checkpoint
  std::map<std::string, std::string> extra;  // the files asked for, verified
};

// The newest checkpoint every rank can load, loaded: each rank verifies and stages the files it
// needs, the ranks agree, and only then is the state replaced. A checkpoint that fails on any rank
// is skipped on all (marked DAMAGED by the rank that found the damage, with the file named) and
// the one before it tried. nullopt when none loads. Collective.
std::optional<LoadedFsdpCheckpoint> load_latest_checkpoint(
    FullyShardedDataParallelBase& fsdp,
    torch::optim::Optimizer* optimizer,
    checkpoint::Checkpointer& checkpointer,
    const std::vector<std::string>& extra_files = {});

}  // namespace trainyard::fsdp
