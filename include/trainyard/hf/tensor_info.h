// Where one tensor of a Hugging Face weight file lies: its dtype, shape, file and the byte range
// of its elements there (row-major, contiguous). The safetensors and torch.save readers both
// produce these, so one reader serves every format.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "trainyard/hf/dtype.h"

namespace trainyard::hf {

struct TensorInfo {
  std::string name;                 // "gpt_neox.layers.0.attention.dense.weight"
  Dtype dtype = Dtype::F32;         // as stored in the file
  std::vector<std::int64_t> shape;  // empty for a scalar
  std::filesystem::path file;       // the file that holds the elements
  std::uint64_t offset = 0;         // bytes from the start of `file` to element 0

  std::uint64_t numel() const;
  std::uint64_t nbytes() const { return numel() * element_size(dtype); }
};

// "[4096, 4096]", for messages.
std::string shape_string(const std::vector<std::int64_t>& shape);

}  // namespace trainyard::hf
