#include "trainyard/checkpoint/checkpointer.h"

#include <openssl/evp.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "trainyard/error.h"
#include "trainyard/log.h"

namespace trainyard::checkpoint {
namespace {

constexpr std::string_view kPrefix = "checkpoint_";
constexpr int kManifestFormat = 1;

struct Listing {
  std::set<std::int64_t> all;       // numbers of every checkpoint with a stored file
  std::set<std::int64_t> complete;  // those with a manifest
};

Listing scan(Storage& storage) {
  Listing out;
  for (const auto& key : storage.list(std::string(kPrefix))) {
    const auto slash = key.find('/');
    if (slash == std::string::npos) continue;
    const auto number = checkpoint_number(std::string_view(key).substr(0, slash));
    if (number < 0) continue;
    out.all.insert(number);
    if (key.substr(slash + 1) == Checkpointer::kManifest) out.complete.insert(number);
  }
  return out;
}

void remove_checkpoint(Storage& storage, const std::string& name) {
  // The manifest first: a checkpoint half removed is then incomplete, never "complete but broken".
  storage.remove(name + "/" + Checkpointer::kManifest);
  storage.remove_all(name + "/");
}

}  // namespace

std::string checkpoint_name(std::int64_t number) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "checkpoint_%06" PRId64, number);
  return buf;
}

std::int64_t checkpoint_number(std::string_view name) {
  if (!name.starts_with(kPrefix) || name.size() == kPrefix.size()) return -1;
  std::int64_t n = 0;
  for (char c : name.substr(kPrefix.size())) {
    if (c < '0' || c > '9' || n > (INT64_MAX - 9) / 10) return -1;
    n = n * 10 + (c - '0');
  }
  return n;
}

std::string sha256_hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  TY_CHECK_T(Error,
             EVP_Digest(data.data(), data.size(), digest, &length, EVP_sha256(), nullptr) == 1,
             "OpenSSL could not compute a SHA-256 digest.");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * length);
  for (unsigned int i = 0; i < length; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 15];
  }
  return out;
}

Checkpointer::Checkpointer(const std::string& uri, CheckpointerOptions options)
    : Checkpointer(open_storage(uri), options) {}

Checkpointer::Checkpointer(std::unique_ptr<Storage> storage, CheckpointerOptions options)
    : storage_(std::move(storage)), options_(options) {
  TY_CHECK(storage_ != nullptr, "Checkpointer needs a storage.");
  TY_CHECK(options_.num_to_keep >= 0, "num_to_keep must be >= 0 (0 keeps all), got ",
           options_.num_to_keep, ".");
}

Checkpointer::~Checkpointer() {
  if (background_.joinable()) background_.join();
}

void Checkpointer::save_in_background(Checkpoint checkpoint) {
  wait();
  background_ = std::thread([this, c = std::move(checkpoint)] {
    try {
      const auto start = std::chrono::steady_clock::now();
      std::size_t bytes = 0;
      for (const auto& [file, data] : c.files) bytes += data.size();
      background_name_ = save(c);
      logger("checkpoint")
          ->info("Saved {} at step {} ({:.1f} MB) in {:.2f} s in the background", *background_name_,
                 c.step, bytes / 1e6,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    } catch (...) {
      background_error_ = std::current_exception();
    }
  });
}

std::optional<std::string> Checkpointer::wait() {
  if (background_.joinable()) background_.join();
  if (background_error_) std::rethrow_exception(std::exchange(background_error_, nullptr));
  return background_name_;
}

std::string Checkpointer::save(const Checkpoint& checkpoint) {
  for (const auto& [file, unused] : checkpoint.files) {
    TY_CHECK(!file.empty() && file.find('/') == std::string::npos && file != kManifest,
             "Bad checkpoint file name '", file, "': plain names other than ", kManifest, ".");
  }
  const auto before = scan(*storage_);
  const std::int64_t number = before.all.empty() ? 0 : *before.all.rbegin() + 1;
  const std::string name = checkpoint_name(number);

  nlohmann::json files = nlohmann::json::object();
  for (const auto& [file, contents] : checkpoint.files) {
    storage_->write(name + "/" + file, contents);
    files[file] = {{"bytes", contents.size()}, {"sha256", sha256_hex(contents)}};
  }
  const nlohmann::json manifest = {{"format", kManifestFormat},
                                   {"name", name},
                                   {"step", checkpoint.step},
                                   {"created_unix", static_cast<std::int64_t>(std::time(nullptr))},
                                   {"files", files}};
  storage_->write(name + "/" + kManifest, manifest.dump(2) + "\n");

  // Retention: the newest num_to_keep complete ones stay; incomplete ones older than this save
  // are leftovers of killed saves (only one writer saves at a time). `before` plus this one is
  // what is stored now, so no second listing is needed.
  std::set<std::int64_t> complete = before.complete;
  complete.insert(number);
  std::set<std::int64_t> doomed;
  if (options_.num_to_keep > 0 &&
      complete.size() > static_cast<std::size_t>(options_.num_to_keep)) {
    doomed.insert(complete.begin(), std::prev(complete.end(), options_.num_to_keep));
  }
  for (auto n : before.all) {
    if (!complete.contains(n)) doomed.insert(n);
  }
  for (auto n : doomed) {
    try {
      remove_checkpoint(*storage_, checkpoint_name(n));
    } catch (const Error& e) {
      logger("checkpoint")->warn("Could not remove old {}: {}", checkpoint_name(n), e.what());
    }
  }
  return name;
}

LoadedCheckpoint Checkpointer::load(const std::string& name) {
  const auto where = join_uri(storage_->uri(), name);
  const auto manifest_text = storage_->read(name + "/" + kManifest);
  if (!manifest_text) {
    throw CheckpointCorruptError(
        detail::concat(where, " has no ", kManifest, ": the save did not complete."));
  }
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(*manifest_text);
  } catch (const std::exception& e) {
    throw CheckpointCorruptError(
        detail::concat(where, "/", kManifest, " is not valid JSON: ", e.what()));
  }
  if (!manifest.is_object() || manifest.value("format", 0) != kManifestFormat ||
      !manifest.contains("files") || !manifest["files"].is_object() || !manifest.contains("step") ||
      !manifest["step"].is_number_integer()) {
    throw CheckpointCorruptError(detail::concat(where, "/", kManifest, " is not a format-",
                                                kManifestFormat,
                                                " manifest (needs format, step, files)."));
  }
  LoadedCheckpoint out{.name = name, .checkpoint = {.step = manifest["step"].get<std::int64_t>()}};
  for (const auto& [file, info] : manifest["files"].items()) {
    auto contents = storage_->read(name + "/" + file);
    if (!contents) {
      throw CheckpointCorruptError(detail::concat(where, "/", file, " is missing."));
    }
    const auto bytes = info.value("bytes", std::uint64_t{0});
    if (contents->size() != bytes) {
      throw CheckpointCorruptError(detail::concat(where, "/", file, " has ", contents->size(),
                                                  " bytes; the manifest says ", bytes, "."));
    }
    if (sha256_hex(*contents) != info.value("sha256", "")) {
      throw CheckpointCorruptError(
          detail::concat(where, "/", file, " does not match its SHA-256 in the manifest."));
    }
    out.checkpoint.files.emplace(file, std::move(*contents));
  }
  return out;
}

std::optional<LoadedCheckpoint> Checkpointer::load_latest() {
  const auto complete = list_complete();
  for (auto it = complete.rbegin(); it != complete.rend(); ++it) {
    try {
      return load(*it);
    } catch (const CheckpointCorruptError& e) {
      logger("checkpoint")->warn("Skipping {} and trying the one before it: {}", *it, e.what());
    }
  }
  return std::nullopt;
}

std::vector<std::string> Checkpointer::list_complete() {
  std::vector<std::string> names;
  for (auto n : scan(*storage_).complete) names.push_back(checkpoint_name(n));
  return names;
}

}  // namespace trainyard::checkpoint
