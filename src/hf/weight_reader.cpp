#include "trainyard/hf/weight_reader.h"

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "file_io.h"
#include "trainyard/error.h"
#include "trainyard/hf/safetensors_file.h"
#include "trainyard/hf/torch_zip.h"

namespace trainyard::hf {
namespace fs = std::filesystem;
using ::trainyard::detail::concat;

// Note [Reading with pread]
// Each slice is read with pread into the caller's buffer (same dtype) or through a bounded
// bounce buffer that is converted chunk by chunk. Pages a process has mapped from a file count
// in its RSS until unmapped or dropped with madvise(MADV_DONTNEED), so an mmap reader must
// release every consumed range to keep RSS down, and a file that shrinks under a mapping kills
// the reader with SIGBUS. pread touches the page cache, not the process: RSS grows only by
// the destination and kChunkBytes, and a short file is an exception naming the tensor. The
// extra copy (page cache to user memory) costs what an mmap page-fault-and-copy costs.

namespace {

constexpr std::uint64_t kChunkBytes = 4u << 20;  // source bytes converted per pread

std::string read_text_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  TY_CHECK(in, "Cannot open '", path.string(), "'.");
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace

std::string_view weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::kSafetensors:
      return kSafetensorsName;
    case WeightFormat::kShardedSafetensors:
      return kSafetensorsIndexName;
    case WeightFormat::kTorchBin:
      return kTorchBinName;
    case WeightFormat::kShardedTorchBin:
      return kTorchBinIndexName;
  }
  return "?";
}

struct WeightReader::Impl {
  fs::path dir;
  WeightFormat format = WeightFormat::kSafetensors;
  std::vector<TensorInfo> tensors;
  std::vector<std::string> names;
  std::unordered_map<std::string, std::size_t> by_name;
  std::map<fs::path, std::unique_ptr<detail::ReadOnlyFile>> files;

  void add_file(const fs::path& file) {
    auto listed =
        (format == WeightFormat::kSafetensors || format == WeightFormat::kShardedSafetensors)
            ? list_safetensors(file)
            : list_torch_zip(file);
    files.emplace(file, std::make_unique<detail::ReadOnlyFile>(file));
    for (auto& t : listed) {
      const auto [it, inserted] = by_name.emplace(t.name, tensors.size());
      if (!inserted)
        throw CheckpointCorruptError(concat("Tensor '", t.name, "' is in both '",
                                            tensors[it->second].file.string(), "' and '",
                                            file.string(), "'; which one to load is ambiguous."));
      names.push_back(t.name);
      tensors.push_back(std::move(t));
    }
  }

  void add_index(const fs::path& index_path) {
    auto corrupt = [&](auto&&... parts) {
      return CheckpointCorruptError(concat("'", index_path.string(), "' ", parts...));
    };
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(read_text_file(index_path));
    } catch (const nlohmann::json::exception& e) {
      throw corrupt("is not JSON (", e.what(), ").");
    }
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      throw corrupt("has no \"weight_map\" object mapping tensor names to shard files.");
    // Shards in name order (model-00001-of-00003... sorts as numbered), so names() follows
    // the files; weight_map keys are usually sorted by tensor name, not by file.
    std::map<std::string, std::string> first_tensor;  // shard -> a tensor it should hold
    for (const auto& [name, v] : index["weight_map"].items()) {
      if (!v.is_string())
        throw corrupt("maps tensor '", name, "' to ", v.dump(), ", not a file name.");
      const auto shard = v.get<std::string>();
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
        throw corrupt("maps tensor '", name, "' to '", shard,
                      "', not a file name in the model directory.");
      first_tensor.emplace(shard, name);
    }
    for (const auto& [shard, tensor] : first_tensor) {
      const fs::path file = dir / shard;
      if (!fs::exists(file))
        throw corrupt("names the shard file '", shard, "' (holding tensor '", tensor,
                      "' and others), which is missing from '", dir.string(),
                      "'. HINT: download every shard the index lists.");
      add_file(file);
    }
    for (const auto& [name, v] : index["weight_map"].items()) {
      const fs::path file = dir / v.get<std::string>();
      const auto it = by_name.find(name);
      if (it == by_name.end() || tensors[it->second].file != file)
        throw corrupt("says tensor '", name, "' is in '", file.string(),
                      "', but that file has no such tensor.");
    }
  }

  const TensorInfo& find(const std::string& name) const {
    const auto it = by_name.find(name);
    if (it == by_name.end())
      throw InvalidArgumentError(concat("The model in '", dir.string(), "' (",
                                        weight_format_name(format), ", ", tensors.size(),
                                        " tensors) has no tensor '", name, "'."));
    return tensors[it->second];
  }
};

WeightReader::WeightReader(const fs::path& model_dir) : impl_(std::make_unique<Impl>()) {
  impl_->dir = model_dir;
  struct Candidate {
    std::string_view name;
    WeightFormat format;
  };
  for (const Candidate c : {Candidate{kSafetensorsName, WeightFormat::kSafetensors},
                            Candidate{kSafetensorsIndexName, WeightFormat::kShardedSafetensors},
                            Candidate{kTorchBinName, WeightFormat::kTorchBin},
                            Candidate{kTorchBinIndexName, WeightFormat::kShardedTorchBin}}) {
    const fs::path path = model_dir / c.name;
    if (!fs::exists(path)) continue;
    impl_->format = c.format;
    if (c.format == WeightFormat::kSafetensors || c.format == WeightFormat::kTorchBin)
      impl_->add_file(path);
    else
      impl_->add_index(path);
    return;
  }
  throw InvalidArgumentError(concat(
      "'", model_dir.string(), "' holds no model weights: none of ", kSafetensorsName, ", ",
      kSafetensorsIndexName, ", ", kTorchBinName, " or ", kTorchBinIndexName,
      " is there. HINT: point at the directory save_pretrained wrote (the one with config.json)."));
}

WeightReader WeightReader::open(const std::string& uri) {
  constexpr std::string_view kFile = "file://";
  if (uri.rfind("s3://", 0) == 0)
    throw InvalidArgumentError(concat(
        "Cannot read model weights from '", uri,
        "' directly: the storage layer reads whole "
        "objects only, and a weight file must be read by byte ranges. HINT: copy the model to a "
        "local or shared directory (aws s3 sync ",
        uri, " /local/dir) and pass that path."));
  if (uri.rfind(kFile, 0) == 0) return WeightReader(fs::path(uri.substr(kFile.size())));
  TY_CHECK(uri.find("://") == std::string::npos, "Cannot read model weights from '", uri,
           "': use a directory path, file:///abs/dir, or a local copy of s3:// data.");
  return WeightReader(fs::path(uri));
}

WeightReader::WeightReader(WeightReader&&) noexcept = default;
WeightReader& WeightReader::operator=(WeightReader&&) noexcept = default;
WeightReader::~WeightReader() = default;

WeightFormat WeightReader::format() const {
  return impl_->format;
}
const fs::path& WeightReader::dir() const {
  return impl_->dir;
}
const std::vector<std::string>& WeightReader::names() const {
  return impl_->names;
}
bool WeightReader::contains(const std::string& name) const {
  return impl_->by_name.count(name);
}
const TensorInfo& WeightReader::info(const std::string& name) const {
  return impl_->find(name);
}

void WeightReader::read(const std::string& name,
                        std::uint64_t element_begin,
                        std::uint64_t element_count,
                        Dtype out_dtype,
                        void* dst) const {
  const TensorInfo& t = impl_->find(name);
  const std::uint64_t numel = t.numel();
  TY_CHECK(element_begin <= numel && element_count <= numel - element_begin,
           "Cannot read elements [", element_begin, ", ", element_begin + element_count,
           ") of tensor '", name, "' in '", t.file.string(), "': it has ", numel, " (shape ",
           shape_string(t.shape), ").");
  TY_CHECK(is_convertible(t.dtype, out_dtype), "Cannot read tensor '", name, "' in '",
           t.file.string(), "' (", dtype_name(t.dtype), ") as ", dtype_name(out_dtype),
           ": only F32, F16, BF16 and F64 convert, to F32, F16 or BF16. HINT: read it as ",
           dtype_name(t.dtype), ".");
  if (element_count == 0) return;
  const auto& file = *impl_->files.at(t.file);
  const std::size_t in_size = element_size(t.dtype);
  const std::uint64_t offset = t.offset + element_begin * in_size;
  const std::string what = concat("tensor '", name, "'");
  // See Note [Reading with pread].
  if (out_dtype == t.dtype) {
    file.read_exact(offset, element_count * in_size, dst, what);
    return;
  }
  const std::uint64_t chunk_elems = kChunkBytes / in_size;
  const auto buffer = std::make_unique<unsigned char[]>(
      static_cast<std::size_t>(std::min(element_count, chunk_elems) * in_size));
  auto* out = static_cast<unsigned char*>(dst);
  const std::size_t out_size = element_size(out_dtype);
  for (std::uint64_t done = 0; done < element_count;) {
    const std::uint64_t n = std::min(element_count - done, chunk_elems);
    file.read_exact(offset + done * in_size, n * in_size, buffer.get(), what);
    convert(buffer.get(), t.dtype, out + done * out_size, out_dtype, static_cast<std::size_t>(n));
    done += n;
  }
}

void WeightReader::check_shape(const std::string& name,
                               const std::vector<std::int64_t>& expected,
                               std::string_view source) const {
  const TensorInfo& t = impl_->find(name);
  if (t.shape != expected)
    throw CheckpointCorruptError(concat("Tensor '", name, "' in '", t.file.string(), "' has shape ",
                                        shape_string(t.shape), ", but ", source, " gives ",
                                        shape_string(expected),
                                        ". HINT: the weights and config.json belong to different "
                                        "models."));
}

std::string WeightReader::config_json() const {
  const fs::path path = impl_->dir / kConfigName;
  TY_CHECK(fs::exists(path), "The model in '", impl_->dir.string(), "' has no ", kConfigName,
           " beside its weights.");
  return read_text_file(path);
}

}  // namespace trainyard::hf
