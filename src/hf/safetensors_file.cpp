#include "trainyard/hf/safetensors_file.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "file_io.h"
#include "trainyard/error.h"

namespace trainyard::hf {
namespace {

struct Entry {
  TensorInfo info;
  std::uint64_t begin = 0;  // data_offsets, relative to the data section
  std::uint64_t end = 0;
};

// A shape whose element count fits in 63 bits, or nullopt.
std::optional<std::vector<std::int64_t>> parse_shape(const nlohmann::json& j) {
  if (!j.is_array()) return std::nullopt;
  std::vector<std::int64_t> shape;
  unsigned __int128 numel = 1;
  for (const auto& d : j) {
    if (!d.is_number_integer() || d.get<std::int64_t>() < 0) return std::nullopt;
    shape.push_back(d.get<std::int64_t>());
    numel *= static_cast<std::uint64_t>(shape.back());
    if (numel > (std::uint64_t(1) << 62)) return std::nullopt;
  }
  return shape;
}

}  // namespace

std::vector<TensorInfo> list_safetensors(const std::filesystem::path& file) {
  const detail::ReadOnlyFile f(file);
  auto corrupt = [&](auto&&... parts) {
    return CheckpointCorruptError(::trainyard::detail::concat(
        "'", file.string(), "' is not a valid safetensors file: ", parts...));
  };
  if (f.size() < 8)
    throw corrupt("it has ", f.size(), " bytes, fewer than the 8-byte header length.");
  unsigned char len_bytes[8];
  f.read_exact(0, 8, len_bytes, "the header length");
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t(len_bytes[i]) << (8 * i);
  if (n > kMaxSafetensorsHeaderBytes || n > f.size() - 8)
    throw corrupt("the header length ", n, " exceeds the file's ", f.size(),
                  " bytes (or the 100 MB limit); the file is truncated or not safetensors.");
  const std::string text = f.read_string(8, n, "the header");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw corrupt("the header is not JSON (", e.what(), ").");
  }
  if (!header.is_object()) throw corrupt("the header is not a JSON object.");

  const std::uint64_t data_start = 8 + n;
  const std::uint64_t data_size = f.size() - data_start;
  std::vector<Entry> entries;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") continue;
    auto bad = [&](auto&&... parts) { return corrupt("tensor '", name, "' ", parts...); };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets"))
      throw bad("lacks one of dtype, shape and data_offsets.");
    const auto& jd = v["dtype"];
    const auto dtype = jd.is_string() ? parse_dtype(jd.get<std::string>()) : std::nullopt;
    if (!dtype)
      throw bad("has dtype ", jd.dump(),
                ", which this reader does not read (F32, F16, BF16, F64, I64, I32, I16, I8, U8, "
                "BOOL).");
    auto shape = parse_shape(v["shape"]);
    if (!shape) throw bad("has shape ", v["shape"].dump(), ", not a list of sizes >= 0.");
    const auto& jo = v["data_offsets"];
    if (!jo.is_array() || jo.size() != 2 || !jo[0].is_number_unsigned() ||
        !jo[1].is_number_unsigned())
      throw bad("has data_offsets ", jo.dump(), ", not [begin, end].");
    Entry e;
    e.info = TensorInfo{name, *dtype, std::move(*shape), file, 0};
    e.begin = jo[0].get<std::uint64_t>();
    e.end = jo[1].get<std::uint64_t>();
    if (e.end < e.begin) throw bad("has data_offsets [", e.begin, ", ", e.end, "]: end < begin.");
    if (e.end - e.begin != e.info.nbytes())
      throw bad("has ", e.end - e.begin, " bytes in data_offsets [", e.begin, ", ", e.end,
                "], but dtype ", dtype_name(*dtype), " x shape ", shape_string(e.info.shape),
                " needs ", e.info.nbytes(), ".");
    e.info.offset = data_start + e.begin;
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // The first tensor (in data order) whose bytes are missing is the one to name.
  for (const auto& e : entries)
    if (e.end > data_size)
      throw corrupt("tensor '", e.info.name, "' ends at data offset ", e.end,
                    " but the file holds ", data_size,
                    " data bytes after its header: the file is truncated or the header lies.");
  std::uint64_t expected = 0;
  std::string previous = "the header";
  for (const auto& e : entries) {
    if (e.begin < expected)
      throw corrupt("tensor '", e.info.name, "' (data_offsets [", e.begin, ", ", e.end,
                    "]) overlaps ", previous, ", which ends at ", expected, ".");
    if (e.begin > expected)
      throw corrupt("tensor '", e.info.name, "' starts at data offset ", e.begin, " but ", previous,
                    " ends at ", expected, ": the header leaves a gap.");
    expected = e.end;
    previous = "tensor '" + e.info.name + "'";
  }
  if (expected != data_size)
    throw corrupt("the header's tensors end at data offset ", expected, " but the file holds ",
                  data_size, " data bytes after the header.");
  std::vector<TensorInfo> out;
  out.reserve(entries.size());
  for (auto& e : entries) out.push_back(std::move(e.info));
  return out;
}

}  // namespace trainyard::hf
