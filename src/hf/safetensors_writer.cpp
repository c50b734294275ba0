#include "trainyard/hf/safetensors_writer.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "file_io.h"
#include "trainyard/error.h"
#include "trainyard/hf/weight_reader.h"

namespace trainyard::hf {
namespace fs = std::filesystem;
using ::trainyard::detail::concat;

namespace {

constexpr std::uint64_t kConvertChunkElements = 1u << 20;

// "model-00002-of-00005.safetensors", as save_pretrained names shards.
std::string shard_name(std::size_t index, std::size_t count) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return buf;
}

bool is_shard_name(const std::string& name) {
  unsigned a = 0, b = 0;
  char tail[32] = {};
  return name.size() == std::string_view("model-00001-of-00001.safetensors").size() &&
         std::sscanf(name.c_str(), "model-%5u-of-%5u%31s", &a, &b, tail) == 3 &&
         std::string_view(tail) == ".safetensors";
}

}  // namespace

std::uint64_t TensorSpec::numel() const {
  std::uint64_t n = 1;
  for (const auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

std::map<std::string, std::string> default_safetensors_metadata() {
  return {{"format", "pt"}};
}

// --- SafetensorsWriter -----------------------------------------------------------------------

struct SafetensorsWriter::Impl {
  detail::AtomicFile file;
  std::vector<TensorSpec> tensors;
  std::vector<std::uint64_t> ends;  // data offset where each tensor's bytes end
  std::uint64_t written = 0;        // data bytes appended so far
  std::size_t current = 0;          // the tensor the next byte belongs to
  bool finished = false;

  explicit Impl(fs::path path) : file(std::move(path)) {}

  std::uint64_t total() const { return ends.empty() ? 0 : ends.back(); }
  void advance() {
    while (current < tensors.size() && written >= ends[current]) ++current;
  }
};

SafetensorsWriter::SafetensorsWriter(fs::path path,
                                     std::vector<TensorSpec> tensors,
                                     const std::map<std::string, std::string>& metadata) {
  std::set<std::string> seen;
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<std::uint64_t> ends;
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    TY_CHECK(!t.name.empty() && t.name != "__metadata__" && seen.insert(t.name).second,
             "Cannot write '", path.string(), "': the tensor name '", t.name,
             "' is empty, reserved or used twice.");
    for (const auto d : t.shape)
      TY_CHECK(d >= 0, "Cannot write tensor '", t.name, "' to '", path.string(), "': its shape ",
               shape_string(t.shape), " has a negative size.");
    const std::uint64_t begin = offset;
    offset += t.nbytes();
    ends.push_back(offset);
    header[t.name] = {
        {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {begin, offset}}};
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  impl_ = std::make_unique<Impl>(std::move(path));
  impl_->tensors = std::move(tensors);
  impl_->ends = std::move(ends);
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((json.size() >> (8 * i)) & 0xff);
  impl_->file.write(len, 8);
  impl_->file.write(json.data(), json.size());
  impl_->advance();
}

SafetensorsWriter::~SafetensorsWriter() = default;

void SafetensorsWriter::append(const void* data, std::uint64_t bytes) {
  auto& s = *impl_;
  TY_CHECK(!s.finished && bytes <= s.total() - s.written, "Cannot append ", bytes, " bytes to '",
           s.file.final_path().string(), "': only ", s.total() - s.written,
           " of its data remain to be written.");
  s.file.write(data, bytes);
  s.written += bytes;
  s.advance();
}

void SafetensorsWriter::append(const void* data, Dtype src_dtype, std::uint64_t element_count) {
  auto& s = *impl_;
  TY_CHECK(!s.finished && s.current < s.tensors.size(), "Cannot append ", element_count,
           " elements to '", s.file.final_path().string(), "': all its tensors are written.");
  const TensorSpec& t = s.tensors[s.current];
  const std::size_t out_size = element_size(t.dtype);
  const std::uint64_t begin = s.ends[s.current] - t.nbytes();
  TY_CHECK((s.written - begin) % out_size == 0 &&
               element_count * out_size <= s.ends[s.current] - s.written,
           "Cannot append ", element_count, " elements to tensor '", t.name, "' in '",
           s.file.final_path().string(), "': ", (s.ends[s.current] - s.written) / out_size,
           " of its ", t.numel(), " elements remain; a converted piece stays inside one tensor.");
  if (src_dtype == t.dtype) return append(data, element_count * out_size);
  TY_CHECK(is_convertible(src_dtype, t.dtype), "Cannot write ", dtype_name(src_dtype),
           " elements to tensor '", t.name, "' (", dtype_name(t.dtype), ") in '",
           s.file.final_path().string(), "'.");
  std::vector<unsigned char> buffer(std::min(element_count, kConvertChunkElements) * out_size);
  const auto* in = static_cast<const unsigned char*>(data);
  const std::size_t in_size = element_size(src_dtype);
  for (std::uint64_t done = 0; done < element_count;) {
    const std::uint64_t n = std::min(element_count - done, kConvertChunkElements);
    convert(in + done * in_size, src_dtype, buffer.data(), t.dtype, static_cast<std::size_t>(n));
    append(buffer.data(), n * out_size);
    done += n;
  }
}

void SafetensorsWriter::finish() {
  auto& s = *impl_;
  TY_CHECK(!s.finished, "'", s.file.final_path().string(), "' was finished already.");
  TY_CHECK(s.written == s.total(), "Cannot finish '", s.file.final_path().string(), "': tensor '",
           s.current < s.tensors.size() ? s.tensors[s.current].name : "",
           "' and what follows lack ", s.total() - s.written, " bytes.");
  s.file.commit();
  s.finished = true;
}

const std::string& SafetensorsWriter::current_tensor() const {
  static const std::string kNone;
  return impl_->current < impl_->tensors.size() ? impl_->tensors[impl_->current].name : kNone;
}
std::uint64_t SafetensorsWriter::bytes_remaining() const {
  return impl_->total() - impl_->written;
}
const fs::path& SafetensorsWriter::path() const {
  return impl_->file.final_path();
}

// --- ShardedSafetensorsWriter ----------------------------------------------------------------

std::vector<std::vector<std::size_t>> plan_shards(const std::vector<TensorSpec>& tensors,
                                                  std::uint64_t max_shard_bytes) {
  TY_CHECK(max_shard_bytes > 0, "ShardedWriterOptions.max_shard_bytes must be > 0.");
  std::vector<std::vector<std::size_t>> shards(1);
  std::uint64_t size = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::uint64_t bytes = tensors[i].nbytes();
    if (!shards.back().empty() && size + bytes > max_shard_bytes) {
      shards.emplace_back();
      size = 0;
    }
    shards.back().push_back(i);
    size += bytes;
  }
  return shards;
}

struct ShardedSafetensorsWriter::Impl {
  fs::path dir;
  std::vector<TensorSpec> tensors;
  ShardedWriterOptions options;
  std::vector<std::vector<std::size_t>> plan;
  std::vector<std::string> files;
  std::size_t shard = 0;  // the shard being written
  std::optional<SafetensorsWriter> writer;
  bool finished = false;

  void open_shard() {
    std::vector<TensorSpec> specs;
    for (const auto i : plan[shard]) specs.push_back(tensors[i]);
    writer.emplace(dir / files[shard], std::move(specs), options.metadata);
  }
  // Finishes full shards and opens the next, until one needs bytes or all are done.
  void advance() {
    while (writer && writer->bytes_remaining() == 0 && shard + 1 < plan.size()) {
      writer->finish();
      ++shard;
      open_shard();
    }
  }
};

ShardedSafetensorsWriter::ShardedSafetensorsWriter(fs::path dir,
                                                   std::vector<TensorSpec> tensors,
                                                   ShardedWriterOptions options)
    : impl_(std::make_unique<Impl>()) {
  auto& s = *impl_;
  s.plan = plan_shards(tensors, options.max_shard_bytes);
  s.dir = std::move(dir);
  s.tensors = std::move(tensors);
  s.options = std::move(options);
  for (std::size_t i = 0; i < s.plan.size(); ++i)
    s.files.push_back(s.plan.size() == 1 ? std::string(kSafetensorsName)
                                         : shard_name(i, s.plan.size()));
  s.open_shard();
  s.advance();
}

ShardedSafetensorsWriter::~ShardedSafetensorsWriter() = default;

void ShardedSafetensorsWriter::append(const void* data, std::uint64_t bytes) {
  auto& s = *impl_;
  TY_CHECK(!s.finished, "Cannot append to the export in '", s.dir.string(), "': it is finished.");
  const auto* in = static_cast<const unsigned char*>(data);
  while (bytes > 0) {
    const std::uint64_t n = std::min(bytes, s.writer->bytes_remaining());
    TY_CHECK(n > 0, "Cannot append ", bytes, " more bytes to the export in '", s.dir.string(),
             "': every tensor is complete.");
    s.writer->append(in, n);
    in += n;
    bytes -= n;
    s.advance();
  }
}

void ShardedSafetensorsWriter::append(const void* data,
                                      Dtype src_dtype,
                                      std::uint64_t element_count) {
  auto& s = *impl_;
  TY_CHECK(!s.finished, "Cannot append to the export in '", s.dir.string(), "': it is finished.");
  s.writer->append(data, src_dtype, element_count);
  s.advance();
}

void ShardedSafetensorsWriter::finish() {
  auto& s = *impl_;
  TY_CHECK(!s.finished && s.shard + 1 == s.plan.size(), "Cannot finish the export in '",
           s.dir.string(), "': shard ", s.shard + 1, " of ", s.plan.size(), " is being written.");
  s.writer->finish();
  s.finished = true;
  std::set<std::string> keep(s.files.begin(), s.files.end());
  if (s.plan.size() > 1) {
    nlohmann::json index;
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < s.plan.size(); ++i)
      for (const auto t : s.plan[i]) {
        index["weight_map"][s.tensors[t].name] = s.files[i];
        total += s.tensors[t].nbytes();
      }
    index["metadata"]["total_size"] = total;
    detail::write_file_atomically(s.dir / kSafetensorsIndexName, index.dump(2) + "\n");
    keep.insert(std::string(kSafetensorsIndexName));
  }
  // See the class comment: leftovers of an export with another shard count would mislead a reader.
  for (const auto& entry : fs::directory_iterator(s.dir)) {
    const std::string name = entry.path().filename().string();
    const bool ours =
        name == kSafetensorsName || name == kSafetensorsIndexName || is_shard_name(name);
    if (ours && !keep.count(name)) fs::remove(entry.path());
  }
}

const std::vector<std::string>& ShardedSafetensorsWriter::shard_files() const {
  return impl_->files;
}

void write_config_json(const fs::path& dir, std::string_view json_text) {
  detail::write_file_atomically(dir / kConfigName, json_text);
}

}  // namespace trainyard::hf
