// The central directory of a zip archive, ZIP64 included, read with a few positioned reads: the
// entries' names, sizes, compression and where each one's bytes start. Enough for torch.save
// archives, which store (never deflate) every record, so a tensor's bytes can be read in place.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "file_io.h"

namespace trainyard::hf::detail {

struct ZipEntry {
  std::string name;
  std::uint16_t method = 0;  // 0 stored, 8 deflated
  std::uint64_t compressed_size = 0;
  std::uint64_t size = 0;
  std::uint64_t data_offset = 0;  // of the first byte of the (stored) data in the archive
};

// Every entry of the archive `file`, by name. Throws CheckpointCorruptError naming the file when
// the end-of-directory records, a directory entry or a local header is missing or points
// outside the file.
std::map<std::string, ZipEntry> read_zip_directory(const ReadOnlyFile& file);

}  // namespace trainyard::hf::detail
