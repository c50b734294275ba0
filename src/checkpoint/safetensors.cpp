#include "trainyard/checkpoint/safetensors.h"

#include <torch/torch.h>

#include <array>
#include <cstring>
#include <nlohmann/json.hpp>

#include "trainyard/error.h"

namespace trainyard::checkpoint {
namespace {

constexpr std::array<std::pair<std::string_view, torch::ScalarType>, 10> kDtypes{{
    {"F64", torch::kFloat64},
    {"F32", torch::kFloat32},
    {"F16", torch::kFloat16},
    {"BF16", torch::kBFloat16},
    {"I64", torch::kInt64},
    {"I32", torch::kInt32},
    {"I16", torch::kInt16},
    {"I8", torch::kInt8},
    {"U8", torch::kUInt8},
    {"BOOL", torch::kBool},
}};

// A header larger than this is not a header (Hugging Face's reader refuses 100 MB).
constexpr std::uint64_t kMaxHeaderBytes = 100 << 20;

}  // namespace

std::string_view safetensors_dtype(torch::ScalarType dtype) {
  for (const auto& [name, type] : kDtypes)
    if (type == dtype) return name;
  throw InvalidArgumentError(
      detail::concat("safetensors has no name for dtype ", dtype, "; convert the tensor first."));
}

std::string encode_safetensors(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<torch::Tensor> contiguous;
  contiguous.reserve(tensors.size());
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    TY_CHECK(name != "__metadata__" && !header.contains(name), "encode_safetensors: the name '",
             name, "' is reserved or used twice.");
    contiguous.push_back(t.detach().to(torch::kCPU).contiguous());
    const auto bytes = static_cast<std::uint64_t>(contiguous.back().nbytes());
    header[name] = {{"dtype", safetensors_dtype(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // data 8-byte aligned, as Hugging Face pads
  std::string out(8 + json.size() + offset, '\0');
  std::uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 8, json.data(), json.size());
  char* data = out.data() + 8 + json.size();
  for (const auto& t : contiguous) {
    std::memcpy(data, t.data_ptr(), t.nbytes());
    data += t.nbytes();
  }
  return out;
}

SafetensorsView::SafetensorsView(std::string_view bytes, std::string what)
    : what_(std::move(what)) {
  auto corrupt = [&](auto&&... parts) {
    return CheckpointCorruptError(
        detail::concat(what_, " is not a valid safetensors file: ", parts...));
  };
  if (bytes.size() < 8) throw corrupt("it has ", bytes.size(), " bytes, fewer than the header.");
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
  if (n > kMaxHeaderBytes || n > bytes.size() - 8)
    throw corrupt("the header length ", n, " exceeds the file's ", bytes.size(), " bytes.");
  data_ = bytes.substr(8 + n);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.substr(8, n));
  } catch (const std::exception& e) {
    throw corrupt("its header is not JSON (", e.what(), ").");
  }
  if (!header.is_object()) throw corrupt("its header is not a JSON object.");
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) throw corrupt("__metadata__ is not an object.");
      for (const auto& [k, v] : info.items()) {
        if (!v.is_string()) throw corrupt("__metadata__.", k, " is not a string.");
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    try {
      Entry e;
      const auto dtype = info.at("dtype").get<std::string>();
      auto it = std::find_if(kDtypes.begin(), kDtypes.end(),
                             [&](const auto& d) { return d.first == dtype; });
      if (it == kDtypes.end())
        throw corrupt("tensor ", name, " has the unknown dtype ", dtype, ".");
      e.dtype = it->second;
      e.shape = info.at("shape").get<std::vector<std::int64_t>>();
      const auto offsets = info.at("data_offsets").get<std::vector<std::uint64_t>>();
      if (offsets.size() != 2) throw corrupt("tensor ", name, "'s data_offsets is not a pair.");
      e.begin = offsets[0];
      e.end = offsets[1];
      std::uint64_t numel = 1;
      for (auto d : e.shape) {
        if (d < 0) throw corrupt("tensor ", name, " has a negative dimension.");
        numel *= static_cast<std::uint64_t>(d);
      }
      if (e.begin > e.end || e.end > data_.size() ||
          e.end - e.begin != numel * c10::elementSize(e.dtype))
        throw corrupt("tensor ", name, "'s bytes [", e.begin, ", ", e.end,
                      ") do not fit its shape and dtype within the ", data_.size(),
                      " data bytes (a truncated file?).");
      entries_.emplace(name, std::move(e));
    } catch (const nlohmann::json::exception& ex) {
      throw corrupt("tensor ", name, "'s entry is malformed (", ex.what(), ").");
    }
  }
}

torch::Tensor SafetensorsView::tensor(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end())
    throw CheckpointCorruptError(detail::concat(what_, " has no tensor named ", name, "."));
  const Entry& e = it->second;
  auto out = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype));
  std::memcpy(out.data_ptr(), data_.data() + e.begin, e.end - e.begin);
  return out;
}

}  // namespace trainyard::checkpoint
