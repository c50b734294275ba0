#include "trainyard/hf/torch_zip.h"

#include "file_io.h"
#include "pickle_vm.h"
#include "trainyard/error.h"
#include "zip_directory.h"

namespace trainyard::hf {
namespace {

// Row-major strides for `size`; dimensions of extent 1 may carry any stride, as torch allows.
bool is_contiguous(const std::vector<std::int64_t>& size, const std::vector<std::int64_t>& stride) {
  std::int64_t expected = 1;
  for (std::size_t i = size.size(); i-- > 0;) {
    if (size[i] == 0) return true;
    if (size[i] != 1 && stride[i] != expected) return false;
    expected *= size[i];
  }
  return true;
}

}  // namespace

std::vector<TensorInfo> list_torch_zip(const std::filesystem::path& file) {
  const detail::ReadOnlyFile f(file);
  const auto entries = detail::read_zip_directory(f);
  const std::string where = ::trainyard::detail::concat("'", file.string(), "'");
  auto corrupt = [&](auto&&... parts) {
    return CheckpointCorruptError(::trainyard::detail::concat(where, " ", parts...));
  };

  // The archive's folder name is the saved file's stem in torch 1.13 ("pytorch_model/") and
  // "archive/" in later versions; data.pkl is the one record directly inside it.
  std::string prefix;
  for (const auto& [name, e] : entries) {
    const auto slash = name.find('/');
    if (slash != std::string::npos && name.substr(slash + 1) == "data.pkl") {
      if (!prefix.empty())
        throw corrupt("holds two pickles ('", prefix, "data.pkl', '", name, "').");
      prefix = name.substr(0, slash + 1);
    }
  }
  if (prefix.empty())
    throw corrupt("is a zip archive without <archive>/data.pkl: not a torch.save file.");
  auto stored = [&](const std::string& name) -> const detail::ZipEntry& {
    const auto it = entries.find(name);
    if (it == entries.end()) throw corrupt("lacks the record '", name, "'.");
    if (it->second.method != 0 || it->second.compressed_size != it->second.size)
      throw corrupt("stores the record '", name, "' compressed (zip method ", it->second.method,
                    "); torch.save never compresses. HINT: re-save it with torch.save.");
    return it->second;
  };

  if (entries.count(prefix + "byteorder")) {
    const auto& e = stored(prefix + "byteorder");
    const auto order = f.read_string(e.data_offset, e.size, "the byteorder record");
    if (order != "little")
      throw corrupt("was saved on a '", order,
                    "'-endian machine; only little-endian archives "
                    "are read. HINT: re-save it on a little-endian machine.");
  }

  const auto& pkl = stored(prefix + "data.pkl");
  const auto pickle = f.read_string(pkl.data_offset, pkl.size, "data.pkl");
  const auto tensors = detail::load_pickled_state_dict(pickle, where + " (" + prefix + "data.pkl)");

  std::vector<TensorInfo> out;
  out.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    TensorInfo info{name, t.dtype, t.size, file, 0};
    for (const auto d : t.size)
      if (d < 0) throw corrupt("tensor '", name, "' has shape ", shape_string(t.size), ".");
    if (!is_contiguous(t.size, t.stride))
      throw corrupt("tensor '", name, "' has shape ", shape_string(t.size), " with strides ",
                    shape_string(t.stride),
                    ", not contiguous; only contiguous tensors are read. HINT: save "
                    "{k: v.contiguous() for k, v in state_dict.items()}.");
    const std::string record = prefix + "data/" + t.storage_key;
    const auto& e = stored(record);
    const std::size_t esize = element_size(t.dtype);
    if (e.size < t.storage_numel * esize)
      throw corrupt("record '", record, "' has ", e.size, " bytes but tensor '", name,
                    "' says its storage holds ", t.storage_numel, " ", dtype_name(t.dtype),
                    " elements (", t.storage_numel * esize, " bytes).");
    if (t.storage_offset + info.numel() > t.storage_numel)
      throw corrupt("tensor '", name, "' (", info.numel(), " elements at offset ", t.storage_offset,
                    ") runs past the end of its storage '", record, "' of ", t.storage_numel,
                    " elements.");
    info.offset = e.data_offset + t.storage_offset * esize;
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace trainyard::hf
