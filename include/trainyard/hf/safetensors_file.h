// The safetensors format (Hugging Face): an 8-byte little-endian header length N, N bytes of
// JSON {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__":
// {..}}, then the tensors' bytes, offsets counted from the end of the header. This reads the
// header only; WeightReader reads the elements.
#pragma once

#include <filesystem>
#include <vector>

#include "trainyard/hf/tensor_info.h"

namespace trainyard::hf {

// A header longer than this is refused (Hugging Face's reader refuses 100 MB).
constexpr std::uint64_t kMaxSafetensorsHeaderBytes = 100u << 20;

// The tensors of one safetensors file, in the order of their data. Reads the header (one small
// read); checks that every dtype is known, every shape non-negative, every byte range matches
// dtype x shape, and that the ranges tile the data exactly, with no gap, overlap or byte past
// the end of the file, as the safetensors library does. Throws CheckpointCorruptError naming
// the file and the tensor (a truncated file names the tensor whose bytes are missing).
std::vector<TensorInfo> list_safetensors(const std::filesystem::path& file);

}  // namespace trainyard::hf
