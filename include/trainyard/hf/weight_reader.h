// Reads a Hugging Face model directory's weights by slices: model.safetensors, a sharded
// model.safetensors.index.json, pytorch_model.bin (torch.save zip) or a sharded
// pytorch_model.bin.index.json, chosen in that order, as from_pretrained does. A rank asks for
// elements [begin, begin + n) of one tensor, flattened, converted to fp32 or bf16 into its own
// buffer; only those bytes are read (see Note [Reading with pread] in src/hf/weight_reader.cpp),
// so loading an FSDP shard never needs the model's full size in memory.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "trainyard/hf/tensor_info.h"

namespace trainyard::hf {

// File names Hugging Face's save_pretrained and from_pretrained use.
inline constexpr std::string_view kSafetensorsName = "model.safetensors";
inline constexpr std::string_view kSafetensorsIndexName = "model.safetensors.index.json";
inline constexpr std::string_view kTorchBinName = "pytorch_model.bin";
inline constexpr std::string_view kTorchBinIndexName = "pytorch_model.bin.index.json";
inline constexpr std::string_view kConfigName = "config.json";

enum class WeightFormat { kSafetensors, kShardedSafetensors, kTorchBin, kShardedTorchBin };
std::string_view weight_format_name(WeightFormat format);  // "model.safetensors", ...

class WeightReader {
 public:
  // Opens the weights in `model_dir`: reads every file's header or zip directory and pickle
  // (small reads), no tensor data. Throws InvalidArgumentError when the directory has none of
  // the four weight files, and CheckpointCorruptError naming the file (and tensor) for a
  // damaged file, an index naming a missing shard file or a tensor its shard lacks, or a tensor
  // found in two files.
  explicit WeightReader(const std::filesystem::path& model_dir);
  // A local path or file:///abs/path. s3:// is refused with a hint (the storage layer reads
  // whole objects only); see the report in docs or the error's text.
  static WeightReader open(const std::string& uri);

  WeightReader(WeightReader&&) noexcept;
  WeightReader& operator=(WeightReader&&) noexcept;
  ~WeightReader();

  WeightFormat format() const;
  const std::filesystem::path& dir() const;

  // Every tensor's name, in file order (shard after shard).
  const std::vector<std::string>& names() const;
  bool contains(const std::string& name) const;
  // Throws InvalidArgumentError naming the tensor and the directory when there is no such tensor.
  const TensorInfo& info(const std::string& name) const;

  // Reads elements [element_begin, element_begin + element_count) of tensor `name`, flattened
  // row-major, into dst as out_dtype (F32 or BF16 or F16 from any float type, or the stored
  // dtype unchanged; see convert()). dst holds element_count * element_size(out_dtype) bytes.
  // Blocking; reads only the slice's bytes; thread-safe (concurrent reads share the open files).
  // Throws InvalidArgumentError for a missing tensor, a range past its end or an unsupported
  // conversion, CheckpointCorruptError when the file was cut short since it was opened.
  void read(const std::string& name,
            std::uint64_t element_begin,
            std::uint64_t element_count,
            Dtype out_dtype,
            void* dst) const;

  // Throws CheckpointCorruptError naming the tensor, its file, both shapes and `source` (say
  // "config.json: hidden_size 4096") when the tensor's shape is not `expected`.
  void check_shape(const std::string& name,
                   const std::vector<std::int64_t>& expected,
                   std::string_view source) const;

  // The text of config.json beside the weights; InvalidArgumentError when there is none.
  std::string config_json() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainyard::hf
