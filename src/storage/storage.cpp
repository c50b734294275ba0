#include "trainyard/storage/storage.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "trainyard/error.h"
#include "trainyard/heartbeat.h"
#include "trainyard/remove_tree.h"
#include "trainyard/storage/s3_storage.h"

namespace trainyard::storage {
namespace fs = std::filesystem;
namespace {

constexpr std::string_view kTempMarker = ".tmp.";  // in the names of files being written

bool is_temporary(const fs::path& p) {
  return p.filename().string().find(kTempMarker) != std::string::npos;
}

// Keys are relative '/'-separated paths; refuse anything that could leave the root.
void check_key(const std::string& key) {
  TY_CHECK(!key.empty() && key.front() != '/' && key.find('\0') == std::string::npos,
           "Bad storage key '", key, "': keys are non-empty relative paths.");
  for (std::size_t begin = 0; begin <= key.size();) {
    const auto end = std::min(key.find('/', begin), key.size());
    const auto part = std::string_view(key).substr(begin, end - begin);
    TY_CHECK(!part.empty() && part != "." && part != "..", "Bad storage key '", key,
             "': empty, '.' or '..' path components are not allowed.");
    begin = end + 1;
  }
}

[[noreturn]] void throw_io(const std::string& what, const fs::path& path, int err) {
  throw Error(detail::concat(what, " '", path.string(), "': ", std::strerror(err),
                             ". HINT: check that the storage is mounted, writable and not full."));
}

void fsync_path(const fs::path& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) throw_io("Cannot open", path, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw_io("Cannot fsync", path, err);
}

// A directory on a local or shared file system. Writes go to a temporary name in the target
// directory, are fsync'd, renamed into place, and the directory is fsync'd, so a crash leaves
// either the old object or the new one, and a reader never sees a partial file.
// FileStorage writes a file in slices of this many bytes.
constexpr std::size_t kWriteSlice = std::size_t{64} << 20;

class FileStorage final : public Storage {
 public:
  FileStorage(fs::path root, std::string uri) : root_(std::move(root)), uri_(std::move(uri)) {}

  void write(const std::string& key, std::string_view data) override {
    check_key(key);
    const fs::path path = root_ / key;
    std::error_code ec;
    fs::path tmp = path;
    tmp += detail::concat(kTempMarker, ::getpid());
    int fd = -1;
    // A concurrent remove() may delete the folder once it is empty, between its creation and the
    // open (another writer's claim withdrawn): then create it again.
    for (int attempt = 0; fd < 0; ++attempt) {
      fs::create_directories(path.parent_path(), ec);
      if (ec) throw_io("Cannot create the directory", path.parent_path(), ec.value());
      fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0 && (errno != ENOENT || attempt == 4)) throw_io("Cannot create", tmp, errno);
    }
    std::size_t done = 0;
    int err = 0;
    while (done < data.size()) {
      // In slices, beating between them: a large checkpoint file's write is progress
      // (Note [Hang watchdog]); a write that never returns is not.
      heartbeat_while_waiting();
      const ssize_t n = ::write(fd, data.data() + done, std::min(data.size() - done, kWriteSlice));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        err = n < 0 ? errno : EIO;
        break;
      }
      done += static_cast<std::size_t>(n);
    }
    if (err == 0 && ::fsync(fd) != 0) err = errno;
    if (::close(fd) != 0 && err == 0) err = errno;
    if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
    if (err != 0) {
      fs::remove(tmp, ec);
      throw_io("Cannot write", path, err);
    }
    fsync_path(path.parent_path(), O_RDONLY | O_DIRECTORY);
  }

  std::optional<std::string> read_range(const std::string& key,
                                        std::uint64_t offset,
                                        std::uint64_t length) override {
    return read_bytes(key, offset, length);
  }

  std::optional<std::string> read(const std::string& key) override {
    return read_bytes(key, 0, std::nullopt);
  }

  std::vector<std::string> list(const std::string& prefix) override {
    std::vector<std::string> keys;
    std::error_code ec;
    if (!fs::exists(root_, ec)) return keys;
    list_into(root_, prefix, keys);
    std::sort(keys.begin(), keys.end());
    return keys;
  }

  void remove(const std::string& key) override {
    check_key(key);
    const fs::path path = root_ / key;
    std::error_code ec;
    fs::remove(path, ec);
    if (ec) throw_io("Cannot remove", path, ec.value());
    // Drop directories the removal emptied, up to the root.
    for (auto dir = path.parent_path(); dir != root_ && dir.string().size() > root_.string().size();
         dir = dir.parent_path()) {
      if (!fs::is_empty(dir, ec) || ec) break;
      fs::remove(dir, ec);
    }
  }

  void remove_all(const std::string& prefix) override {
    // Checkpoints are folders: a prefix "name/" is removed as one, temporary files included.
    if (!prefix.ends_with('/')) return Storage::remove_all(prefix);
    check_key(prefix.substr(0, prefix.size() - 1));
    std::error_code ec;
    remove_tree((root_ / prefix).string(), ec);
    if (ec) throw_io("Cannot remove", root_ / prefix, ec.value());
  }

  std::string uri() const override { return uri_; }

 private:
  // The keys starting with `prefix` under the folder `dir`, into `keys`. A folder below the root
  // that is removed while the walk reaches it (another writer withdrawing its claim: remove()
  // drops the folders it empties) is skipped, as a listing a moment later would not show it;
  // walking the whole tree with one recursive_directory_iterator failed the listing instead.
  // Folders reached through symbolic links are not walked.
  void list_into(const fs::path& dir, const std::string& prefix, std::vector<std::string>& keys) {
    std::error_code ec;
    const auto vanished = [&] {
      return ec == std::errc::no_such_file_or_directory && dir != root_;
    };
    for (fs::directory_iterator it(dir, ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      std::error_code type_ec;
      if (it->is_directory(type_ec) && !it->is_symlink(type_ec)) {
        list_into(it->path(), prefix, keys);
        continue;
      }
      if (!it->is_regular_file(type_ec) || is_temporary(it->path())) continue;
      auto key = it->path().lexically_relative(root_).generic_string();
      if (key.starts_with(prefix)) keys.push_back(std::move(key));
    }
    if (ec && !vanished()) throw_io("Cannot list", dir, ec.value());
  }

  // Bytes [offset, offset + length) of the file (all from offset on without a length), fewer
  // at its end; nullopt when there is no file.
  std::optional<std::string> read_bytes(const std::string& key,
                                        std::uint64_t offset,
                                        std::optional<std::uint64_t> length) {
    check_key(key);
    const fs::path path = root_ / key;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) return std::nullopt;
    if (fd < 0) throw_io("Cannot open", path, errno);
    if (!length) {
      struct stat st {};
      if (::fstat(fd, &st) != 0) {
        const int err = errno;
        ::close(fd);
        throw_io("Cannot read", path, err);
      }
      const auto size = static_cast<std::uint64_t>(st.st_size);
      length = size > offset ? size - offset : 0;
    }
    std::string out(*length, '\0');
    std::uint64_t done = 0;
    while (done < *length) {
      const ssize_t n =
          ::pread(fd, out.data() + done, *length - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int err = errno;
        ::close(fd);
        throw_io("Cannot read", path, err);
      }
      if (n == 0) break;
      done += static_cast<std::uint64_t>(n);
    }
    ::close(fd);
    out.resize(done);
    return out;
  }

  fs::path root_;
  std::string uri_;
};

}  // namespace

std::unique_ptr<Storage> open_storage(const std::string& uri) {
  TY_CHECK(!uri.empty(),
           "The storage URI is empty; give a directory, file:///dir or s3://bucket/prefix.");
  const auto scheme_end = uri.find("://");
  if (scheme_end == std::string::npos) {
    return std::make_unique<FileStorage>(fs::absolute(uri).lexically_normal(), uri);
  }
  const std::string scheme = uri.substr(0, scheme_end);
  if (scheme == "file") {
    const std::string path = uri.substr(scheme_end + 3);
    TY_CHECK(path.starts_with("/"), "Bad storage URI '", uri,
             "': file URIs take an absolute path, as in file:///shared/runs.");
    return std::make_unique<FileStorage>(fs::path(path).lexically_normal(), uri);
  }
  if (scheme == "s3") return make_s3_storage(S3Config::from_uri(uri));
  throw InvalidArgumentError(
      detail::concat("Unsupported storage URI scheme '", scheme, "' in '", uri,
                     "'. HINT: use a directory, file:///dir or s3://bucket/prefix."));
}

void download(Storage& storage,
              const std::string& key,
              const std::string& path,
              std::uint64_t piece_bytes) {
  TY_CHECK(piece_bytes > 0, "storage::download needs piece_bytes > 0.");
  const fs::path target(path);
  fs::create_directories(target.parent_path());
  const fs::path tmp = target.string() + ".download." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    TY_CHECK_T(Error, out.good(), "Cannot create ", tmp.string(), ": ", std::strerror(errno), ".");
    for (std::uint64_t offset = 0;; offset += piece_bytes) {
      auto piece = storage.read_range(key, offset, piece_bytes);
      if (!piece) {
        out.close();
        fs::remove(tmp);
        throw Error(detail::concat("There is no ", join_uri(storage.uri(), key), " to download."));
      }
      out.write(piece->data(), static_cast<std::streamsize>(piece->size()));
      TY_CHECK_T(Error, out.good(), "Cannot write ", tmp.string(), ": ", std::strerror(errno), ".");
      if (piece->size() < piece_bytes) break;
    }
  }
  fs::rename(tmp, target);
}

std::string join_uri(const std::string& uri, const std::string& relative) {
  if (relative.empty()) return uri;
  if (uri.empty() || uri.back() == '/') return uri + relative;
  return uri + "/" + relative;
}

}  // namespace trainyard::storage
