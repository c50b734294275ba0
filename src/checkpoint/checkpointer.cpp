#include "trainyard/checkpoint/checkpointer.h"

#include <openssl/evp.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "trainyard/error.h"
#include "trainyard/heartbeat.h"
#include "trainyard/log.h"
#include "trainyard/metrics/names.h"
#include "trainyard/metrics/recording.h"
#include "trainyard/metrics/registry.h"

namespace trainyard::checkpoint {

using storage::join_uri;
using storage::open_storage;
using storage::Storage;
namespace {

constexpr std::string_view kPrefix = "checkpoint_";
constexpr int kManifestFormat = 1;

struct Listing {
  std::set<std::int64_t> all;                               // every checkpoint with a stored file
  std::set<std::int64_t> complete;                          // with a manifest, not damaged
  std::set<std::int64_t> damaged;                           // marked DAMAGED by a load
  std::set<std::int64_t> best;                              // marked BEST (mark_best)
  std::map<std::int64_t, std::vector<std::string>> claims;  // number -> claimers' tokens
  std::map<std::int64_t, std::vector<std::string>> files;   // number -> its stored files' names
};

Listing scan(Storage& storage) {
  Listing out;
  std::set<std::int64_t> manifests;
  for (const auto& key : storage.list(std::string(kPrefix))) {
    const auto slash = key.find('/');
    if (slash == std::string::npos) continue;
    const auto number = checkpoint_number(std::string_view(key).substr(0, slash));
    if (number < 0) continue;
    out.all.insert(number);
    const std::string_view file = std::string_view(key).substr(slash + 1);
    if (!file.starts_with(Checkpointer::kClaimPrefix)) out.files[number].emplace_back(file);
    if (file == Checkpointer::kManifest) manifests.insert(number);
    if (file == Checkpointer::kDamaged) out.damaged.insert(number);
    if (file == Checkpointer::kBest) out.best.insert(number);
    if (file.starts_with(Checkpointer::kClaimPrefix)) {
      out.claims[number].emplace_back(file.substr(std::strlen(Checkpointer::kClaimPrefix)));
    }
  }
  for (auto n : manifests) {
    if (!out.damaged.contains(n)) out.complete.insert(n);
  }
  return out;
}

// Removes the manifest first: a checkpoint half removed is then incomplete, never "complete but
// broken".
void remove_checkpoint(Storage& storage, const std::string& name) {
  storage.remove(name + "/" + Checkpointer::kManifest);
  storage.remove_all(name + "/");
}

void check_file_name(const std::string& file) {
  TY_CHECK(!file.empty() && file.find('/') == std::string::npos &&
               file != Checkpointer::kManifest && file != Checkpointer::kDamaged &&
               file != Checkpointer::kBest && !file.starts_with(Checkpointer::kClaimPrefix),
           "Bad checkpoint file name '", file, "': plain names other than ",
           Checkpointer::kManifest, ", ", Checkpointer::kDamaged, ", ", Checkpointer::kBest,
           " and ", Checkpointer::kClaimPrefix, "*.");
}

nlohmann::json writer_json(const WriterIdentity& w) {
  return {
      {"job_instance", w.job_instance}, {"host", w.host}, {"pid", w.pid}, {"started", w.started}};
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// What saves and loads record into metrics::process_registry(); null when recording is off
// (TRAINYARD_METRICS=0). Seconds are the storage calls' (begin, write_file, commit; read_manifest,
// read_file), so a save split across ranks (FSDP) counts each rank's own writing.
struct CheckpointSeries {
  metrics::Counter& saves;
  metrics::Counter& save_seconds;
  metrics::Counter& save_bytes;
  metrics::Counter& loads;
  metrics::Counter& load_seconds;
  metrics::Counter& load_bytes;
};

const CheckpointSeries* checkpoint_series() {
  static const CheckpointSeries* series = []() -> const CheckpointSeries* {
    if (!metrics::recording_enabled()) return nullptr;
    namespace name = metrics::name;
    auto& r = metrics::process_registry();
    return new CheckpointSeries{
        // never destroyed, as the registry
        .saves = r.counter(name::kCheckpointSaves, "Checkpoints this process committed."),
        .save_seconds =
            r.counter(name::kCheckpointSaveSeconds, "Seconds spent writing checkpoints."),
        .save_bytes = r.counter(name::kCheckpointSaveBytes, "Bytes of checkpoint files written."),
        .loads = r.counter(name::kCheckpointLoads,
                           "Checkpoints whose loading began (each reads its manifest once)."),
        .load_seconds =
            r.counter(name::kCheckpointLoadSeconds, "Seconds spent reading checkpoints."),
        .load_bytes = r.counter(name::kCheckpointLoadBytes, "Bytes of checkpoint files read.")};
  }();
  return series;
}

// Adds the seconds from its construction to its destruction to a counter (when recording).
class TimeInto {
 public:
  explicit TimeInto(metrics::Counter* counter)
      : counter_(counter), start_(std::chrono::steady_clock::now()) {}
  ~TimeInto() {
    if (counter_ != nullptr)
      counter_->add(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }
  TimeInto(const TimeInto&) = delete;
  TimeInto& operator=(const TimeInto&) = delete;

 private:
  metrics::Counter* counter_;
  std::chrono::steady_clock::time_point start_;
};

metrics::Counter* save_seconds() {
  const auto* s = checkpoint_series();
  return s != nullptr ? &s->save_seconds : nullptr;
}
metrics::Counter* load_seconds() {
  const auto* s = checkpoint_series();
  return s != nullptr ? &s->load_seconds : nullptr;
}

std::string hex_of(const unsigned char* digest, unsigned int length) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * length);
  for (unsigned int i = 0; i < length; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 15];
  }
  return out;
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
  // In slices, beating between them: hashing a large checkpoint file takes seconds
  // (Note [Hang watchdog]).
  constexpr std::size_t kSlice = std::size_t{64} << 20;
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  bool ok = ctx != nullptr && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1;
  for (std::size_t at = 0; ok && at < data.size(); at += kSlice) {
    heartbeat_while_waiting();
    ok = EVP_DigestUpdate(ctx.get(), data.data() + at, std::min(kSlice, data.size() - at)) == 1;
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  ok = ok && EVP_DigestFinal_ex(ctx.get(), digest, &length) == 1;
  TY_CHECK_T(Error, ok, "OpenSSL could not compute a SHA-256 digest.");
  return hex_of(digest, length);
}

Checkpointer::Checkpointer(const std::string& uri, CheckpointerOptions options)
    : Checkpointer(open_storage(uri), std::move(options)) {}

Checkpointer::Checkpointer(std::unique_ptr<Storage> storage, CheckpointerOptions options)
    : storage_(std::move(storage)),
      options_(std::move(options)),
      writer_(WriterIdentity::current()) {
  TY_CHECK(storage_ != nullptr, "Checkpointer needs a storage.");
  TY_CHECK(options_.num_to_keep >= 0, "num_to_keep must be >= 0 (0 keeps all), got ",
           options_.num_to_keep, ".");
  if (!options_.job_instance.empty()) writer_.job_instance = options_.job_instance;
  if (!options_.read_only) {
    lease_ = std::make_unique<RunLease>(storage_.get(), writer_,
                                        RunLeaseOptions{.lease_timeout = options_.lease_timeout});
  }
}

Checkpointer::~Checkpointer() {
  if (background_.joinable()) background_.join();
}

void Checkpointer::require_writer(const char* what) const {
  if (options_.read_only) {
    throw InvalidArgumentError(detail::concat("Checkpointer::", what, " on ", storage_->uri(),
                                              ": this Checkpointer is read_only (it holds no "
                                              "lease). HINT: open it with read_only = false."));
  }
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
  if (background_.joinable()) {
    // The background save's bounded storage waits (S3 retries) count as this thread's progress.
    const HeartbeatRelay relay;
    background_.join();
  }
  if (background_error_) std::rethrow_exception(std::exchange(background_error_, nullptr));
  return background_name_;
}

std::string Checkpointer::save(const Checkpoint& checkpoint) {
  require_writer("save");
  for (const auto& [file, unused] : checkpoint.files) check_file_name(file);
  const std::string name = begin();
  try {
    std::map<std::string, FileDigest> digests;
    for (const auto& [file, contents] : checkpoint.files) {
      digests[file] = write_file(name, file, contents);
    }
    commit(name, checkpoint.step, digests);
  } catch (const std::exception& e) {
    logger("checkpoint")
        ->warn("Saving {} failed: {} Removing its partial files.", join_uri(storage_->uri(), name),
               e.what());
    abort(name);
    throw;
  }
  return name;
}

// Note [Checkpoint numbers]
// A writer takes the number after the highest one listed and claims it by writing
// `checkpoint_N/_claim.<token>` (its own, unique name), then lists `checkpoint_N/_claim.`: when
// its claim is the only one, N is its; otherwise it removes its claim and tries a higher number
// after a short random pause. Of two writers racing for N, the one that lists later sees the
// other's claim (claims are written before listing), so they never both win; both may lose and
// move on. This needs only unique-named writes and a consistent listing, so the same code serves
// file systems and S3 (strongly consistent since 2020). The claim also tells retention whose save
// an incomplete checkpoint is: see Note [Retention].
std::string Checkpointer::begin() {
  require_writer("begin");
  TimeInto timed(save_seconds());
  std::minstd_rand rng(std::random_device{}());
  auto listing = scan(*storage_);
  std::int64_t number = std::max(next_number_, listing.all.empty() ? 0 : *listing.all.rbegin() + 1);
  const std::string claim_file = std::string(kClaimPrefix) + writer_.token;
  const std::string claim_text = writer_json(writer_).dump(2) + "\n";
  constexpr int kMaxTries = 100;
  for (int attempt = 1;; ++attempt) {
    const std::string name = checkpoint_name(number);
    const std::string claim = name + "/" + claim_file;
    storage_->write(claim, claim_text);
    const auto claims = storage_->list(name + "/" + kClaimPrefix);
    if (claims.size() == 1 && claims.front() == claim) {
      next_number_ = number + 1;
      return name;
    }
    storage_->remove(claim);
    TY_CHECK_T(Error, attempt < kMaxTries, "Could not claim a checkpoint number in ",
               storage_->uri(), " after ", attempt,
               " tries: another writer claimed each one first (last: ", name,
               "). HINT: are many writers saving into this run folder at once?");
    std::this_thread::sleep_for(std::chrono::milliseconds(
        std::uniform_int_distribution<int>(0, 10 * std::min(attempt, 20))(rng)));
    listing = scan(*storage_);
    number = std::max(number + 1, listing.all.empty() ? 0 : *listing.all.rbegin() + 1);
  }
}

FileDigest Checkpointer::write_file(const std::string& name,
                                    const std::string& file,
                                    std::string_view bytes) {
  require_writer("write_file");
  TY_CHECK(checkpoint_number(name) >= 0, "Bad checkpoint name '", name,
           "': expected checkpoint_NNNNNN, as begin() returns.");
  check_file_name(file);
  TimeInto timed(save_seconds());
  storage_->write(name + "/" + file, bytes);
  if (const auto* series = checkpoint_series())
    series->save_bytes.add(static_cast<double>(bytes.size()));
  return FileDigest{.bytes = bytes.size(), .sha256 = sha256_hex(bytes)};
}

void Checkpointer::commit(const std::string& name,
                          std::int64_t step,
                          const std::map<std::string, FileDigest>& files) {
  require_writer("commit");
  const std::int64_t number = checkpoint_number(name);
  TY_CHECK(number >= 0, "Bad checkpoint name '", name,
           "': expected checkpoint_NNNNNN, as begin() returns.");
  nlohmann::json listed = nlohmann::json::object();
  for (const auto& [file, digest] : files) {
    check_file_name(file);
    listed[file] = {{"bytes", digest.bytes}, {"sha256", digest.sha256}};
  }
  const nlohmann::json manifest = {{"format", kManifestFormat},
                                   {"name", name},
                                   {"step", step},
                                   {"created_unix", static_cast<std::int64_t>(std::time(nullptr))},
                                   {"writer", writer_json(writer_)},
                                   {"files", listed}};
  TimeInto timed(save_seconds());
  lease_->check();  // See Note [Run lease]: a writer that lost the folder commits nothing.
  storage_->write(name + "/" + kManifest, manifest.dump(2) + "\n");
  if (const auto* series = checkpoint_series()) series->saves.add(1);
  apply_retention(number);
}

void Checkpointer::abort(const std::string& name) noexcept {
  try {
    // Only while the number is still ours alone: a writer that lost its lease may find its
    // number claimed again by the new owner (Note [Run lease]).
    const auto claims = storage_->list(name + "/" + kClaimPrefix);
    if (claims != std::vector<std::string>{name + "/" + kClaimPrefix + writer_.token}) {
      logger("checkpoint")
          ->warn("Not removing {}: it is no longer claimed by this writer alone.",
                 join_uri(storage_->uri(), name));
      return;
    }
    remove_checkpoint(*storage_, name);
  } catch (const std::exception& e) {
    logger("checkpoint")
        ->error(
            "Could not remove the partial checkpoint {}: {} It stays incomplete (never "
            "loaded) until a later save's retention removes it.",
            join_uri(storage_->uri(), name), e.what());
  }
}

// Note [Retention]
// After committing N, a writer removes (a) complete checkpoints beyond the newest num_to_keep,
// and (b) incomplete checkpoints numbered below N that are provably abandoned: no claim at all
// (a writer claims before writing anything), or every claimer's lease is gone or abandoned
// (Note [Run lease]), or the claim is this writer's own. Another live writer's save in progress
// — another rank of this job writing its files, or a foreign job in the moment before it is
// refused — is never touched, nor is a checkpoint marked DAMAGED (kept for inspection). What
// a stale lease leaves behind goes at the next save after it expires. Every removal is logged
// with its reason; an incomplete one as a warning naming its files, since they may be intact
// shards of a save whose manifest alone is missing.
// A checkpoint is removed manifest first. So a loader that finds a file missing while another
// writer of the job commits can tell removal from damage: the manifest is gone too. It then
// lists again (a newer checkpoint is there) instead of marking DAMAGED on what is going away.
void Checkpointer::apply_retention(std::int64_t committed) {
  std::map<std::int64_t, std::string> doomed;  // number -> why it goes, for the log
  std::map<std::string, LeaseRecord> leases;   // token -> lease, read when needed
  bool leases_read = false;
  Listing listing;
  try {
    listing = scan(*storage_);
    if (options_.num_to_keep > 0 &&
        listing.complete.size() > static_cast<std::size_t>(options_.num_to_keep)) {
      const auto kept = std::prev(listing.complete.end(), options_.num_to_keep);
      for (auto it = listing.complete.begin(); it != kept; ++it)
        if (!listing.best.contains(*it))  // the run's best stays (mark_best)
          doomed[*it] =
              detail::concat("complete, older than the newest ", options_.num_to_keep,
                             " that num_to_keep keeps (from ", checkpoint_name(*kept), ")");
    }
    for (auto n : listing.all) {
      if (n >= committed || listing.complete.contains(n) || listing.damaged.contains(n)) continue;
      const auto it = listing.claims.find(n);
      bool abandoned = true;
      std::vector<std::string> gone;  // claimers whose lease is gone or abandoned
      if (it != listing.claims.end()) {
        for (const auto& token : it->second) {
          if (token == writer_.token) continue;
          if (!leases_read) {
            for (auto& l : list_leases(*storage_)) leases[l.writer.token] = std::move(l);
            leases_read = true;
          }
          const auto lease = leases.find(token);
          if (lease != leases.end() && !lease_abandoned(lease->second, options_.lease_timeout)) {
            abandoned = false;
          }
          gone.push_back(token);
        }
      }
      if (!abandoned) continue;
      doomed[n] = detail::concat(
          "it has no ", kManifest, ", so its save never completed, and ",
          it == listing.claims.end() ? "no writer claims it"
          : gone.empty()             ? "it was this writer's own unfinished save"
                         : "the lease of every writer that claimed it (" + join_names(gone) +
                               ") is released or abandoned",
          ". HINT: a checkpoint counts only once its ", kManifest,
          " is written (copy checkpoint folders with it); to keep an incomplete one for "
          "inspection, put a ",
          kDamaged, " file in it");
    }
  } catch (const std::exception& e) {
    logger("checkpoint")
        ->warn("Retention skipped: could not list {}: {}", storage_->uri(), e.what());
    return;
  }
  // See Note [Retention]: what is removed is always logged with why, an incomplete checkpoint's
  // files named, as a warning (its files may be intact, only uncommitted).
  for (const auto& [n, why] : doomed) {
    const auto where = join_uri(storage_->uri(), checkpoint_name(n));
    const auto& files = listing.files[n];
    if (listing.complete.contains(n)) {
      logger("checkpoint")->info("Removing {}: {}.", where, why);
    } else {
      logger("checkpoint")
          ->warn("Removing {} ({}): {}.", where,
                 files.empty() ? std::string("no files")
                               : detail::concat(
                                     files.size(),
                                     files.size() == 1 ? " file: " : " files: ", join_names(files)),
                 why);
    }
    try {
      remove_checkpoint(*storage_, checkpoint_name(n));
    } catch (const std::exception& e) {
      logger("checkpoint")->warn("Could not remove old {}: {}", checkpoint_name(n), e.what());
    }
  }
}

Manifest Checkpointer::read_manifest(const std::string& name) {
  const auto where = join_uri(storage_->uri(), name);
  TimeInto timed(load_seconds());
  if (const auto* series = checkpoint_series()) series->loads.add(1);
  const auto manifest_text = storage_->read(name + "/" + kManifest);
  if (!manifest_text) {
    throw CheckpointCorruptError(
        detail::concat(where, " has no ", kManifest, ": the save did not complete."));
  }
  // JSON parsers keep one of an object's repeated keys silently; a manifest that lists a file
  // twice (two digests for one file) is not one a save wrote, so its first repeated key is kept
  // here and the manifest refused.
  std::vector<std::set<std::string>> object_keys;  // one set per object being parsed
  std::string repeated;
  const auto note_keys = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) {
      object_keys.emplace_back();
    } else if (event == Event::object_end) {
      object_keys.pop_back();
    } else if (event == Event::key &&
               !object_keys.back().insert(parsed.get<std::string>()).second && repeated.empty()) {
      repeated = parsed.get<std::string>();
    }
    return true;
  };
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(*manifest_text, note_keys);
  } catch (const std::exception& e) {
    throw CheckpointCorruptError(
        detail::concat(where, "/", kManifest, " is not valid JSON: ", e.what()));
  }
  if (!repeated.empty())
    throw CheckpointCorruptError(detail::concat(where, "/", kManifest, " lists \"", repeated,
                                                "\" twice; a save writes each name once."));
  if (!manifest.is_object() || manifest.value("format", 0) != kManifestFormat ||
      !manifest.contains("files") || !manifest["files"].is_object() || !manifest.contains("step") ||
      !manifest["step"].is_number_integer()) {
    throw CheckpointCorruptError(detail::concat(where, "/", kManifest, " is not a format-",
                                                kManifestFormat,
                                                " manifest (needs format, step, files)."));
  }
  Manifest out{.name = name, .step = manifest["step"].get<std::int64_t>()};
  for (const auto& [file, info] : manifest["files"].items()) {
    const auto bytes = info.is_object() ? info.find("bytes") : info.end();
    const auto sha256 = info.is_object() ? info.find("sha256") : info.end();
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == ".." ||
        !info.is_object() || bytes == info.end() || !bytes->is_number_unsigned() ||
        sha256 == info.end() || !sha256->is_string())
      throw CheckpointCorruptError(detail::concat(
          where, "/", kManifest, " has the entry \"", file.substr(0, 256),
          "\", which is not a file name of the checkpoint's folder with {\"bytes\": N, "
          "\"sha256\": \"...\"}."));
    out.files[file] =
        FileDigest{.bytes = bytes->get<std::uint64_t>(), .sha256 = sha256->get<std::string>()};
  }
  return out;
}

std::string Checkpointer::read_file(const Manifest& manifest, const std::string& file) {
  const auto where = join_uri(storage_->uri(), manifest.name) + "/" + file;
  const auto digest = manifest.files.find(file);
  if (digest == manifest.files.end()) {
    throw CheckpointCorruptError(detail::concat(where, " is not in the checkpoint's manifest."));
  }
  TimeInto timed(load_seconds());
  auto contents = storage_->read(manifest.name + "/" + file);
  if (!contents) throw CheckpointCorruptError(detail::concat(where, " is missing."));
  if (const auto* series = checkpoint_series())
    series->load_bytes.add(static_cast<double>(contents->size()));
  if (contents->size() != digest->second.bytes) {
    throw CheckpointCorruptError(detail::concat(
        where, " has ", contents->size(), " bytes; the manifest says ", digest->second.bytes, "."));
  }
  if (sha256_hex(*contents) != digest->second.sha256) {
    throw CheckpointCorruptError(
        detail::concat(where, " does not match its SHA-256 in the manifest."));
  }
  heartbeat_while_waiting();  // a rank loading a large checkpoint is making progress
  return std::move(*contents);
}

void Checkpointer::verify_file(const Manifest& manifest,
                               const std::string& file,
                               std::uint64_t piece_bytes) {
  TY_CHECK(piece_bytes > 0, "verify_file needs piece_bytes > 0.");
  const auto where = join_uri(storage_->uri(), manifest.name) + "/" + file;
  const auto digest = manifest.files.find(file);
  if (digest == manifest.files.end()) {
    throw CheckpointCorruptError(detail::concat(where, " is not in the checkpoint's manifest."));
  }
  TimeInto timed(load_seconds());
  const std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(),
                                                                    &EVP_MD_CTX_free);
  TY_CHECK_T(Error, ctx != nullptr && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1,
             "OpenSSL could not start a SHA-256 digest.");
  std::uint64_t total = 0;
  for (;;) {
    const auto piece = storage_->read_range(manifest.name + "/" + file, total, piece_bytes);
    if (!piece) throw CheckpointCorruptError(detail::concat(where, " is missing."));
    TY_CHECK_T(Error, EVP_DigestUpdate(ctx.get(), piece->data(), piece->size()) == 1,
               "OpenSSL could not compute a SHA-256 digest.");
    total += piece->size();
    if (const auto* series = checkpoint_series())
      series->load_bytes.add(static_cast<double>(piece->size()));
    heartbeat_while_waiting();
    if (piece->size() < piece_bytes || total > digest->second.bytes) break;
  }
  if (total != digest->second.bytes) {
    throw CheckpointCorruptError(detail::concat(where, " has ", total, " bytes; the manifest says ",
                                                digest->second.bytes, "."));
  }
  unsigned char hash[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  TY_CHECK_T(Error, EVP_DigestFinal_ex(ctx.get(), hash, &length) == 1,
             "OpenSSL could not compute a SHA-256 digest.");
  if (hex_of(hash, length) != digest->second.sha256) {
    throw CheckpointCorruptError(
        detail::concat(where, " does not match its SHA-256 in the manifest."));
  }
}

LoadedCheckpoint Checkpointer::load(const std::string& name) {
  const auto manifest = read_manifest(name);
  LoadedCheckpoint out{.name = name, .checkpoint = {.step = manifest.step}};
  for (const auto& [file, digest] : manifest.files)
    out.checkpoint.files.emplace(file, read_file(manifest, file));
  return out;
}

void Checkpointer::mark_damaged(const std::string& name, const std::string& why) noexcept {
  if (options_.read_only) return;
  try {
    // Marked, so that retention and later loads leave it alone (kept for inspection).
    storage_->write(name + "/" + kDamaged,
                    detail::concat(why, "\nFound by ", writer_.describe(), " at unix time ",
                                   std::time(nullptr), ".\n"));
  } catch (const std::exception& m) {
    logger("checkpoint")->warn("Could not mark {} as damaged: {}", name, m.what());
  }
}

void Checkpointer::mark_best(const std::string& name, double metric, const std::string& why) {
  require_writer("mark_best");
  const auto listing = scan(*storage_);
  const auto number = checkpoint_number(name);
  TY_CHECK(listing.complete.contains(number), "Cannot mark ", name,
           " as the best checkpoint: it is not a complete checkpoint of this run.");
  storage_->write(name + "/" + kBest,
                  nlohmann::json{{"metric", metric}, {"why", why}}.dump() + "\n");
  for (auto other : listing.best)
    if (other != number) storage_->remove(checkpoint_name(other) + "/" + kBest);
  // The former best may now be beyond num_to_keep (Note [Retention]).
  if (listing.best.size() > (listing.best.contains(number) ? 1u : 0u)) apply_retention(number);
}

std::optional<Checkpointer::Best> Checkpointer::best() {
  const auto listing = scan(*storage_);
  for (auto it = listing.best.rbegin(); it != listing.best.rend(); ++it) {
    if (!listing.complete.contains(*it)) continue;
    const auto name = checkpoint_name(*it);
    const auto text = storage_->read(name + "/" + kBest);
    const auto j = nlohmann::json::parse(text.value_or(""), nullptr, /*allow_exceptions=*/false);
    // A marker that cannot be read still marks the best; its metric is then unknown (+inf: any
    // later result beats it).
    const double metric = j.is_object() && j.contains("metric") && j["metric"].is_number()
                              ? j["metric"].get<double>()
                              : std::numeric_limits<double>::infinity();
    return Best{name, metric};
  }
  return std::nullopt;
}

std::optional<LoadedCheckpoint> Checkpointer::load_latest() {
  // A writer of this job may commit a newer checkpoint and remove the one being read (Note
  // [Retention]); that is no damage. Look again, a few times at most.
  constexpr int kMaxScans = 3;
  for (int scans = 1;; ++scans) {
    bool removed_meanwhile = false;
    auto loaded = load_latest_listed(scans < kMaxScans, removed_meanwhile);
    if (!removed_meanwhile) return loaded;
  }
}

std::optional<LoadedCheckpoint> Checkpointer::load_latest_listed(bool may_rescan,
                                                                 bool& removed_meanwhile) {
  const auto listing = scan(*storage_);
  std::vector<std::string> damaged;
  for (auto n : listing.damaged) damaged.push_back(checkpoint_name(n));
  for (auto it = listing.complete.rbegin(); it != listing.complete.rend(); ++it) {
    const std::string name = checkpoint_name(*it);
    try {
      return load(name);
    } catch (const CheckpointCorruptError& e) {
      if (!storage_->read(name + "/" + kManifest)) {
        // Retention removes the manifest first: this one went while it was read.
        logger("checkpoint")
            ->info("{} was removed while being read (a newer save's retention); {}.", name,
                   may_rescan ? "looking again" : "trying the one before it");
        if (may_rescan) {
          removed_meanwhile = true;
          return std::nullopt;
        }
        continue;
      }
      logger("checkpoint")->warn("Skipping {} and trying the one before it: {}", name, e.what());
      damaged.push_back(name);
      mark_damaged(name, e.what());
    }
  }
  if (!damaged.empty()) {
    std::sort(damaged.begin(), damaged.end());
    logger("checkpoint")
        ->warn(
            "No checkpoint of {} verifies: starting from scratch; the damaged ones ({}) are "
            "kept for inspection.",
            storage_->uri(), join_names(damaged));
  }
  return std::nullopt;
}

std::vector<std::string> Checkpointer::list_complete() {
  std::vector<std::string> names;
  for (auto n : scan(*storage_).complete) names.push_back(checkpoint_name(n));
  return names;
}

std::vector<std::string> Checkpointer::list_damaged() {
  std::vector<std::string> names;
  for (auto n : scan(*storage_).damaged) names.push_back(checkpoint_name(n));
  return names;
}

}  // namespace trainyard::checkpoint
