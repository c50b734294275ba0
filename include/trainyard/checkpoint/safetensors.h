// Hugging Face's safetensors format: an 8-byte little-endian header length N, N bytes of JSON
// ({"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"key": "value"}}), then the tensors' bytes, little-endian, C order. Offsets
// count from the end of the header. FSDP's sharded and full checkpoints are written in it, so a
// full checkpoint is a Hugging Face model directory's weights.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace trainyard::checkpoint {

// The bytes of a safetensors file holding `tensors` (contiguous CPU copies are taken as needed)
// and `metadata`. Names must be unique; the header is padded so the data starts 8-byte aligned.
std::string encode_safetensors(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata = {});

// A parsed safetensors file over bytes the caller keeps alive.
class SafetensorsView {
 public:
  struct Entry {
    torch::ScalarType dtype;
    std::vector<std::int64_t> shape;
    std::uint64_t begin = 0;  // bytes into the data section
    std::uint64_t end = 0;
  };

  // Parses and checks the header: every range inside the data and as long as its dtype and
  // shape need. Throws CheckpointCorruptError naming `what` (the file) and the problem.
  SafetensorsView(std::string_view bytes, std::string what);

  const std::map<std::string, Entry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  // Tensor `name` copied out of the bytes. Throws CheckpointCorruptError when there is none.
  torch::Tensor tensor(const std::string& name) const;
  const std::string& what() const { return what_; }

 private:
  std::string_view data_;  // the data section
  std::string what_;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// "F32", "BF16", ... for the dtypes safetensors names; throws InvalidArgumentError for others.
std::string_view safetensors_dtype(torch::ScalarType dtype);

}  // namespace trainyard::checkpoint
