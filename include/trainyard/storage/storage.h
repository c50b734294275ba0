// Where checkpoints live: a flat key -> bytes store with atomic whole-object writes, addressed by
// a URI. A plain path or file:///dir is a local or shared file system (NFS, FSx, ...);
// s3://bucket/prefix is Amazon S3 or an S3-compatible service (see s3_storage.h).
// Keys are relative, '/'-separated paths such as "checkpoint_000004/model.pt".
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace trainyard::storage {

class Storage {
 public:
  virtual ~Storage() = default;

  // Stores `data` under `key`. Readers see either no object, the previous one, or all of `data`;
  // never a part of it. Throws Error (NetworkError for a remote store) naming the key.
  virtual void write(const std::string& key, std::string_view data) = 0;

  // The whole object, or nullopt when there is none under `key`.
  virtual std::optional<std::string> read(const std::string& key) = 0;

  // Bytes [offset, offset + length) of the object under `key` (fewer past its end, none from
  // there on), or nullopt when there is none. The file system and S3 read only those bytes (S3:
  // a GET with a Range header); the default reads the whole object.
  virtual std::optional<std::string> read_range(const std::string& key,
                                                std::uint64_t offset,
                                                std::uint64_t length) {
    auto all = read(key);
    if (!all || offset >= all->size()) return all ? std::optional<std::string>("") : std::nullopt;
    return all->substr(offset, length);
  }

  // Every key that starts with `prefix` ("" for all), in lexicographic order. Objects still
  // being written are not listed.
  virtual std::vector<std::string> list(const std::string& prefix) = 0;

  // Removes the object under `key`; no error when there is none.
  virtual void remove(const std::string& key) = 0;

  // Removes every object whose key starts with `prefix`, including the leftovers of writes that
  // never finished where the storage has such things (a file system's temporary files).
  virtual void remove_all(const std::string& prefix) {
    for (const auto& key : list(prefix)) remove(key);
  }

  // The URI this storage was opened with, for messages.
  virtual std::string uri() const = 0;
};

// Opens the storage a URI names: "file:///abs/dir", a plain path ("/shared/runs", "results"),
// or "s3://bucket/prefix". Throws InvalidArgumentError for an unknown scheme or a malformed URI.
std::unique_ptr<Storage> open_storage(const std::string& uri);

// Copies the object under `key` into the local file `path` in pieces of `piece_bytes` (read_range),
// so that a large object never sits in memory: written to a temporary name in the same folder and
// renamed, so `path` is whole or absent. Throws Error naming the key when there is no object.
void download(Storage& storage,
              const std::string& key,
              const std::string& path,
              std::uint64_t piece_bytes = 64ull << 20);

// A URI joined with a relative path: ("s3://b/runs", "job7") -> "s3://b/runs/job7".
std::string join_uri(const std::string& uri, const std::string& relative);

}  // namespace trainyard::storage
