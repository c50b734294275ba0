// A pickle machine for exactly what torch.save writes for a state dict (data.pkl in its zip):
// dicts, tuples, strings, ints, persistent ids for storages, and a short allow-list of globals
// (see Note [Pickle allow-list]). It builds no objects and runs no code: it returns, for each
// tensor of the top-level dict, where its elements lie in which storage record.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "trainyard/hf/dtype.h"

namespace trainyard::hf::detail {

struct PickledTensor {
  Dtype dtype = Dtype::F32;          // of the storage
  std::string storage_key;           // the record "<archive>/data/<storage_key>"
  std::uint64_t storage_numel = 0;   // elements in the storage
  std::uint64_t storage_offset = 0;  // elements before the tensor's first one
  std::vector<std::int64_t> size;
  std::vector<std::int64_t> stride;
};

// Runs `pickle` (protocol 2 to 5 opcodes) and returns the top-level dict's tensors in the order
// they were saved; entries that are not tensors are skipped. Throws CheckpointCorruptError,
// naming `what` (the file and record), for a malformed pickle, an opcode outside the supported
// set, or a global outside the allow-list.
std::vector<std::pair<std::string, PickledTensor>> load_pickled_state_dict(std::string_view pickle,
                                                                           const std::string& what);

}  // namespace trainyard::hf::detail
