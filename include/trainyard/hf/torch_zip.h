// pytorch_model.bin: the zip archive torch.save writes (torch >= 1.6). Its records are
// <archive>/data.pkl, a pickle of the state dict in which each tensor names a storage record
// <archive>/data/<key> (raw little-endian elements, stored uncompressed), plus
// <archive>/version and, from torch 2.1, <archive>/byteorder. Tensors may share a storage at
// different offsets. This finds where each tensor's elements lie; WeightReader reads them.
#pragma once

#include <filesystem>
#include <vector>

#include "trainyard/hf/tensor_info.h"

namespace trainyard::hf {

// The tensors of one torch.save archive, in the order they were saved. Reads only the zip
// directory and data.pkl, whose pickle is interpreted, never executed: globals outside an
// allow-list are refused (see Note [Pickle allow-list] in src/hf/pickle_vm.cpp). Throws
// CheckpointCorruptError naming the file (and the tensor, where one is at fault) for a truncated
// or damaged archive, a big-endian archive, a compressed storage record, a tensor with
// non-contiguous strides or one that runs past its storage.
std::vector<TensorInfo> list_torch_zip(const std::filesystem::path& file);

}  // namespace trainyard::hf
