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

// Bytes [offset, offset + length) of a checkpoint's file (fewer at its end); throws
// (CheckpointCorruptError) when the file is missing.
using RangeReader =
    std::function<std::string(const std::string& file, std::uint64_t offset, std::uint64_t length)>;

// Whole parameters out of a sharded state, one at a time, for one process (generation, export):
// each file's safetensors header is read once, then only the slices of the parameter asked for
// (Note [Reading parameters by ranges]), so memory holds one parameter, never the files. It does
// not check the files' SHA-256: verify them first (checkpoint::Checkpointer::verify_file).
class ShardedParameterReader {
 public:
  // `metadata` is fsdp.json; `file_bytes` the size of each file as the checkpoint's manifest
  // records it (a header that disagrees is damage). `what` names the checkpoint in errors.
  ShardedParameterReader(const std::string& metadata,
                         RangeReader read,
                         std::map<std::string, std::uint64_t> file_bytes,
                         std::string what);
  ~ShardedParameterReader();
  ShardedParameterReader(const ShardedParameterReader&) = delete;
  ShardedParameterReader& operator=(const ShardedParameterReader&) = delete;

  // The parameters it holds and their shapes.
  const std::map<std::string, std::vector<std::int64_t>>& shapes() const;
  // Parameter `name`'s values, fp32, row-major, into `dst` (its numel of them). Throws
  // CheckpointCorruptError naming the file when a slice is missing or malformed.
  void read(const std::string& name, float* dst) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Loads every parameter of an unwrapped `module` (the same names and shapes) from `reader`.
// Throws CheckpointCorruptError for a parameter missing on either side or of another shape.
// A frozen parameter of `module` that the checkpoint does not hold keeps its value.
void load_sharded_into_module(torch::nn::Module& module,
                              const ShardedParameterReader& reader,
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
  std::optional<Strategy> saved_strategy;    // nullopt for a full checkpoint
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
