#include "zip_directory.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "trainyard/error.h"

namespace trainyard::hf::detail {
namespace {

constexpr std::uint32_t kEndOfDirectory = 0x06054b50;
constexpr std::uint32_t kZip64EndOfDirectory = 0x06064b50;
constexpr std::uint32_t kZip64Locator = 0x07064b50;
constexpr std::uint32_t kDirectoryEntry = 0x02014b50;
constexpr std::uint32_t kLocalHeader = 0x04034b50;
constexpr std::uint16_t kZip64ExtraId = 0x0001;
constexpr std::size_t kEndOfDirectoryBytes = 22;
constexpr std::size_t kMaxCommentBytes = 0xffff;

std::uint64_t le(const unsigned char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= std::uint64_t(p[i]) << (8 * i);
  return v;
}

}  // namespace

std::map<std::string, ZipEntry> read_zip_directory(const ReadOnlyFile& file) {
  auto corrupt = [&](auto&&... parts) {
    return CheckpointCorruptError(::trainyard::detail::concat(
        "'", file.path().string(), "' is not a valid zip archive (torch.save format): ", parts...));
  };
  const std::uint64_t size = file.size();
  if (size < kEndOfDirectoryBytes)
    throw corrupt("it has ", size, " bytes, fewer than a zip's end record; it is truncated.");

  // The end record sits in the last 22 bytes plus at most a 64 KiB comment; search backwards.
  const std::uint64_t tail_len =
      std::min<std::uint64_t>(size, kEndOfDirectoryBytes + kMaxCommentBytes);
  std::vector<unsigned char> tail(tail_len);
  file.read_exact(size - tail_len, tail_len, tail.data(), "the zip end record");
  std::int64_t at = -1;
  for (auto i = static_cast<std::int64_t>(tail_len - kEndOfDirectoryBytes); i >= 0; --i)
    if (le(&tail[i], 4) == kEndOfDirectory) {
      at = i;
      break;
    }
  if (at < 0)
    throw corrupt(
        "no end-of-central-directory record; the file is truncated, or it is a legacy "
        "(pre-1.6) torch.save file. HINT: re-save it with a recent torch.save.");
  const unsigned char* eocd = &tail[at];
  std::uint64_t count = le(eocd + 10, 2);
  std::uint64_t dir_size = le(eocd + 12, 4);
  std::uint64_t dir_offset = le(eocd + 16, 4);
  const std::uint64_t eocd_pos = size - tail_len + static_cast<std::uint64_t>(at);

  if (count == 0xffff || dir_size == 0xffffffff || dir_offset == 0xffffffff) {
    // ZIP64: a locator (20 bytes) just before the end record points to the ZIP64 end record.
    if (eocd_pos < 20) throw corrupt("a ZIP64 archive without its ZIP64 locator.");
    unsigned char loc[20];
    file.read_exact(eocd_pos - 20, 20, loc, "the ZIP64 locator");
    if (le(loc, 4) != kZip64Locator) throw corrupt("a ZIP64 archive without its ZIP64 locator.");
    const std::uint64_t rec_pos = le(loc + 8, 8);
    if (rec_pos + 56 > eocd_pos) throw corrupt("the ZIP64 end record lies outside the file.");
    unsigned char rec[56];
    file.read_exact(rec_pos, 56, rec, "the ZIP64 end record");
    if (le(rec, 4) != kZip64EndOfDirectory) throw corrupt("the ZIP64 end record is missing.");
    count = le(rec + 32, 8);
    dir_size = le(rec + 40, 8);
    dir_offset = le(rec + 48, 8);
  }
  if (dir_offset > size || dir_size > size - dir_offset)
    throw corrupt("the central directory (", dir_size, " bytes at ", dir_offset,
                  ") lies outside the file's ", size, " bytes; the file is truncated.");

  std::vector<unsigned char> dir(dir_size);
  file.read_exact(dir_offset, dir_size, dir.data(), "the zip central directory");
  std::map<std::string, ZipEntry> entries;
  std::size_t p = 0;
  for (std::uint64_t i = 0; i < count; ++i) {
    if (p + 46 > dir.size() || le(&dir[p], 4) != kDirectoryEntry)
      throw corrupt("central directory entry ", i, " of ", count, " is missing or damaged.");
    const unsigned char* h = &dir[p];
    ZipEntry e;
    e.method = static_cast<std::uint16_t>(le(h + 10, 2));
    e.compressed_size = le(h + 20, 4);
    e.size = le(h + 24, 4);
    const std::size_t name_len = le(h + 28, 2), extra_len = le(h + 30, 2),
                      comment_len = le(h + 32, 2);
    std::uint64_t local = le(h + 42, 4);
    if (p + 46 + name_len + extra_len + comment_len > dir.size())
      throw corrupt("central directory entry ", i, " runs past the directory.");
    e.name.assign(reinterpret_cast<const char*>(h + 46), name_len);
    // ZIP64 extra field: the 64-bit values of exactly those fields that read 0xffffffff, in
    // the order size, compressed size, local header offset.
    const unsigned char* x = h + 46 + name_len;
    for (std::size_t q = 0; q + 4 <= extra_len;) {
      const auto id = le(x + q, 2), len = le(x + q + 2, 2);
      if (q + 4 + len > extra_len) throw corrupt("entry '", e.name, "' has a damaged extra field.");
      if (id == kZip64ExtraId) {
        std::size_t r = q + 4;
        auto next = [&](std::uint64_t& field) {
          if (field != 0xffffffff) return;
          if (r + 8 > q + 4 + len) throw corrupt("entry '", e.name, "' has a short ZIP64 field.");
          field = le(x + r, 8);
          r += 8;
        };
        next(e.size);
        next(e.compressed_size);
        next(local);
      }
      q += 4 + len;
    }
    p += 46 + name_len + extra_len + comment_len;

    unsigned char lh[30];
    if (local + 30 > size) throw corrupt("entry '", e.name, "' starts past the end of the file.");
    file.read_exact(local, 30, lh, "a zip local header");
    if (le(lh, 4) != kLocalHeader)
      throw corrupt("entry '", e.name, "' has no local header at byte ", local, ".");
    e.data_offset = local + 30 + le(lh + 26, 2) + le(lh + 28, 2);
    if (e.data_offset > size || e.compressed_size > size - e.data_offset)
      throw corrupt("entry '", e.name, "' (", e.compressed_size, " bytes at ", e.data_offset,
                    ") runs past the end of the file's ", size, " bytes; the file is truncated.");
    entries.emplace(e.name, std::move(e));
  }
  return entries;
}

}  // namespace trainyard::hf::detail
