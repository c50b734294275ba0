// File access shared by the Hugging Face readers and writers: positioned reads that never move a
// shared offset (so one open file serves concurrent readers), and a file written under a
// temporary name that appears under its final name only once complete.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace trainyard::hf::detail {

// A file opened read-only. Thread-safe: read_exact uses pread.
class ReadOnlyFile {
 public:
  explicit ReadOnlyFile(std::filesystem::path path);  // throws Error naming the path
  ~ReadOnlyFile();
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;

  // Reads exactly n bytes at `offset` into dst. Throws CheckpointCorruptError naming the file and
  // `what` when the file ends first (it was truncated after it was opened).
  void read_exact(std::uint64_t offset, std::uint64_t n, void* dst, std::string_view what) const;
  std::string read_string(std::uint64_t offset, std::uint64_t n, std::string_view what) const;

  std::uint64_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

// A file written under "<final>.tmp.<pid>" in the same directory; commit() fsyncs it, renames it
// to its final name and fsyncs the directory. Destroyed uncommitted, it removes the temporary.
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path final_path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, std::uint64_t n);  // appends; throws Error naming the file
  void commit();
  const std::filesystem::path& final_path() const { return final_path_; }

 private:
  std::filesystem::path final_path_;
  std::filesystem::path temp_path_;
  int fd_ = -1;
};

// Writes `text` to `path` through an AtomicFile.
void write_file_atomically(const std::filesystem::path& path, std::string_view text);

}  // namespace trainyard::hf::detail
