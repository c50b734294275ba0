// Reader for the IDX format of MNIST and FashionMNIST (gzip-compressed or plain): a big-endian
// header (magic 0x00000800 | type | ndims, then ndims sizes) followed by the raw array.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>

namespace trainyard::data {

// Reads an unsigned-byte IDX file with `expected_dims` dimensions into a uint8 tensor shaped as
// the header says. Throws Error when the file is missing, CorruptDataError when the magic, the
// element type, the number of dimensions or the length of the data is wrong.
torch::Tensor read_idx_ubyte(const std::string& path, int expected_dims);

}  // namespace trainyard::data
