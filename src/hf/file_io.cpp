#include "file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "trainyard/error.h"

namespace trainyard::hf::detail {
namespace {

[[noreturn]] void throw_io(std::string_view what, const std::filesystem::path& path, int err) {
  throw Error(::trainyard::detail::concat(what, " '", path.string(), "': ", std::strerror(err)));
}

void fsync_dir(const std::filesystem::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_io("Cannot open directory", dir, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw_io("Cannot fsync directory", dir, err);
}

}  // namespace

ReadOnlyFile::ReadOnlyFile(std::filesystem::path path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw_io("Cannot open", path_, errno);
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    throw_io("Cannot stat", path_, err);
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
  // Tensors are read front to back; a larger readahead window suits that.
  ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

void ReadOnlyFile::read_exact(std::uint64_t offset,
                              std::uint64_t n,
                              void* dst,
                              std::string_view what) const {
  auto* out = static_cast<char*>(dst);
  while (n > 0) {
    const auto chunk = static_cast<std::size_t>(std::min<std::uint64_t>(n, 1u << 30));
    const ssize_t got = ::pread(fd_, out, chunk, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw_io(::trainyard::detail::concat("Cannot read ", what, " from"), path_, errno);
    }
    if (got == 0)
      throw CheckpointCorruptError(::trainyard::detail::concat(
          "'", path_.string(), "' ends at byte ", offset, " while reading ", what,
          ": the file was truncated after it was opened."));
    out += got;
    offset += static_cast<std::uint64_t>(got);
    n -= static_cast<std::uint64_t>(got);
  }
}

std::string ReadOnlyFile::read_string(std::uint64_t offset,
                                      std::uint64_t n,
                                      std::string_view what) const {
  std::string s(n, '\0');
  read_exact(offset, n, s.data(), what);
  return s;
}

AtomicFile::AtomicFile(std::filesystem::path final_path) : final_path_(std::move(final_path)) {
  temp_path_ = final_path_;
  temp_path_ += ::trainyard::detail::concat(".tmp.", ::getpid());
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_io("Cannot create", temp_path_, errno);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temp_path_.c_str());
  }
}

void AtomicFile::write(const void* data, std::uint64_t n) {
  TY_ASSERT(fd_ >= 0, "write after commit to ", final_path_.string());
  const auto* in = static_cast<const char*>(data);
  while (n > 0) {
    const auto chunk = static_cast<std::size_t>(std::min<std::uint64_t>(n, 1u << 30));
    const ssize_t put = ::write(fd_, in, chunk);
    if (put < 0) {
      if (errno == EINTR) continue;
      throw_io("Cannot write", temp_path_, errno);
    }
    in += put;
    n -= static_cast<std::uint64_t>(put);
  }
}

void AtomicFile::commit() {
  TY_ASSERT(fd_ >= 0, "commit twice of ", final_path_.string());
  if (::fsync(fd_) != 0) throw_io("Cannot fsync", temp_path_, errno);
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) {
    const int err = errno;
    ::unlink(temp_path_.c_str());
    throw_io("Cannot close", temp_path_, err);
  }
  if (::rename(temp_path_.c_str(), final_path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp_path_.c_str());
    throw_io("Cannot rename into place", final_path_, err);
  }
  fsync_dir(final_path_.parent_path());
}

void write_file_atomically(const std::filesystem::path& path, std::string_view text) {
  AtomicFile file(path);
  file.write(text.data(), text.size());
  file.commit();
}

}  // namespace trainyard::hf::detail
