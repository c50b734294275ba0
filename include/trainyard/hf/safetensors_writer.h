// Streaming safetensors export: the header (names, dtypes, shapes) is written first, then each
// tensor's bytes are appended in order, in pieces, so export never holds the whole model. The
// sharded writer splits at a maximum shard size into model-0000i-of-0000N.safetensors plus
// model.safetensors.index.json, as Hugging Face's save_pretrained does. Every file is written
// under a temporary name and renamed into place when complete.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "trainyard/hf/dtype.h"

namespace trainyard::hf {

struct TensorSpec {
  std::string name;
  Dtype dtype = Dtype::F32;  // on disk
  std::vector<std::int64_t> shape;

  std::uint64_t numel() const;
  std::uint64_t nbytes() const { return numel() * element_size(dtype); }
};

// from_pretrained refuses safetensors files without {"format": "pt"} in their metadata.
std::map<std::string, std::string> default_safetensors_metadata();

// One safetensors file. Not thread-safe: one exporting thread feeds it.
class SafetensorsWriter {
 public:
  // Creates "<path>.tmp.<pid>" and writes the header: the tensors' data follow in this order,
  // 8-byte aligned as the format requires. Throws InvalidArgumentError for an empty, reserved or
  // repeated name or a negative size, Error for an I/O failure naming the file.
  SafetensorsWriter(
      std::filesystem::path path,
      std::vector<TensorSpec> tensors,
      const std::map<std::string, std::string>& metadata = default_safetensors_metadata());
  ~SafetensorsWriter();  // unfinished: the temporary file is removed, nothing appears at path
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The next `bytes` bytes of data, already in the on-disk dtypes; a piece may span tensors.
  // Throws InvalidArgumentError past the last tensor's end.
  void append(const void* data, std::uint64_t bytes);
  // The next `element_count` elements of the current tensor, given as `src_dtype` and converted
  // to the tensor's dtype (see convert()). The piece must stay inside the current tensor.
  void append(const void* data, Dtype src_dtype, std::uint64_t element_count);
  // Every byte was appended: fsyncs, renames to the final path, fsyncs the directory. Throws
  // InvalidArgumentError naming the first tensor short of bytes.
  void finish();

  const std::string& current_tensor() const;  // that the next byte belongs to; "" when all given
  std::uint64_t bytes_remaining() const;      // in the whole file's data
  const std::filesystem::path& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct ShardedWriterOptions {
  // A shard closes before the tensor that would take it past this size (a larger tensor gets a
  // shard of its own), as save_pretrained's max_shard_size, whose "5GB" means 5e9 bytes.
  std::uint64_t max_shard_bytes = 5'000'000'000;
  std::map<std::string, std::string> metadata = default_safetensors_metadata();
};

// Which tensors (indices into `tensors`) go to which shard, in order.
std::vector<std::vector<std::size_t>> plan_shards(const std::vector<TensorSpec>& tensors,
                                                  std::uint64_t max_shard_bytes);

// A model's weights in `dir`: model.safetensors when they fit one shard, otherwise
// model-00001-of-0000N.safetensors ... and model.safetensors.index.json
// ({"metadata": {"total_size": bytes}, "weight_map": {name: file}}), which is written last.
// finish() then removes what an earlier export with another shard count left (a stale index,
// model.safetensors or shard files), so the directory holds one consistent set.
class ShardedSafetensorsWriter {
 public:
  ShardedSafetensorsWriter(std::filesystem::path dir,
                           std::vector<TensorSpec> tensors,
                           ShardedWriterOptions options = {});
  ~ShardedSafetensorsWriter();
  ShardedSafetensorsWriter(const ShardedSafetensorsWriter&) = delete;
  ShardedSafetensorsWriter& operator=(const ShardedSafetensorsWriter&) = delete;

  // As SafetensorsWriter's; pieces may span tensors and shards (the raw form).
  void append(const void* data, std::uint64_t bytes);
  void append(const void* data, Dtype src_dtype, std::uint64_t element_count);
  void finish();

  const std::vector<std::string>& shard_files() const;  // file names in dir, in order

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Writes `json_text` as dir/config.json through a temporary file and a rename.
void write_config_json(const std::filesystem::path& dir, std::string_view json_text);

}  // namespace trainyard::hf
