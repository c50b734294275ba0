// Checkpoints of a training run on a Storage (a directory, file:///dir or s3://bucket/prefix).
//
// Layout under the run's URI:
//   _lease/<token>.json                          one per writer (see lease.h, Note [Run lease])
//   checkpoint_000003/_claim.<token>             who took number 3 (Note [Checkpoint numbers])
//   checkpoint_000003/model.pt, state.json, ...  the files, any names, from any writer of the job
//   checkpoint_000003/MANIFEST.json              written last, names the writer
//   checkpoint_000003/DAMAGED.txt                why it failed verification; kept for inspection
// A checkpoint is complete when its manifest exists; the manifest records the step and the size
// and SHA-256 of every file, so a torn, truncated or corrupted file is detected on load. A run
// owns its folder: a writing Checkpointer holds a lease, and one of another job is refused with
// an error naming the holder. Numbers are claimed atomically, so two writers never share one.
// Retention removes only complete checkpoints beyond num_to_keep and incomplete ones that this
// job left or whose writer's lease is gone: never another live writer's save in progress, and
// never a damaged one. A failed save removes its partial files.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "trainyard/checkpoint/lease.h"
#include "trainyard/storage/storage.h"

namespace trainyard::checkpoint {

struct CheckpointerOptions {
  int num_to_keep = 0;  // keep the newest K complete checkpoints; 0 keeps all
  // A reader takes no lease: it loads, and save/begin/write_file/commit throw. Load failures are
  // then only logged, not marked DAMAGED.
  bool read_only = false;
  std::chrono::seconds lease_timeout{30};  // a writer's lease not renewed this long is abandoned
  // Which job this writer belongs to (Note [Run lease]); empty: $TRAINYARD_JOB_INSTANCE, else
  // this process alone.
  std::string job_instance{};
};

// One file of a checkpoint as written: what the manifest records.
struct FileDigest {
  std::uint64_t bytes = 0;
  std::string sha256;  // hex
};

struct Checkpoint {
  std::int64_t step = 0;                       // the training step counter when it was taken
  std::map<std::string, std::string> files{};  // file name -> contents
};

// A complete checkpoint's manifest: its step and every file's digest.
struct Manifest {
  std::string name;  // "checkpoint_000003"
  std::int64_t step = 0;
  std::map<std::string, FileDigest> files{};
};

struct LoadedCheckpoint {
  std::string name;  // "checkpoint_000003"
  Checkpoint checkpoint;
};

class Checkpointer {
 public:
  // `uri` is the run's folder; it need not exist yet. Unless read_only, takes the run's lease
  // (blocks on storage calls): throws Error naming the holder when a live writer of another job
  // instance holds the folder. Every method blocks on storage calls; a Checkpointer is used from
  // one thread at a time (save_in_background's thread counts as the caller's).
  explicit Checkpointer(const std::string& uri, CheckpointerOptions options = {});
  Checkpointer(std::unique_ptr<storage::Storage> storage, CheckpointerOptions options = {});
  ~Checkpointer();  // waits for a background save; releases the lease

  // Writes a new checkpoint and returns its name: begin(), write_file() for each file, commit().
  // When a write fails, removes the checkpoint's partial files (best effort) and rethrows.
  std::string save(const Checkpoint& checkpoint);

  // The steps of save(), for checkpoints written by several processes of one job (FSDP: every
  // rank writes its own files): one writer begin()s and passes the name to the others, each
  // write_file()s its files into it (from its own Checkpointer on the same folder, same job
  // instance), and the first gathers the digests and commit()s. Until then the checkpoint is
  // incomplete, and no other writer removes it while this job's lease lives.
  //
  // Claims the next number (Note [Checkpoint numbers]) and returns its name.
  std::string begin();
  // Stores one file of checkpoint `name` and returns its digest. `file` is a plain name.
  FileDigest write_file(const std::string& name, const std::string& file, std::string_view bytes);
  // Checks the lease, writes the manifest (the checkpoint is then complete), then applies
  // retention. Throws, writing no manifest, when the lease was lost.
  void commit(const std::string& name,
              std::int64_t step,
              const std::map<std::string, FileDigest>& files);
  // Removes an uncommitted checkpoint's files (best effort, logs what it cannot remove).
  void abort(const std::string& name) noexcept;

  // save() on a background thread, so that training goes on while the files are written: waits
  // for the previous background save (rethrowing its error), then returns at once. At most one
  // save runs at a time; a process killed meanwhile leaves an incomplete checkpoint, which loads
  // never pick.
  void save_in_background(Checkpoint checkpoint);
  // Waits for the background save, if any, and returns its name; rethrows its error.
  std::optional<std::string> wait();

  // The newest complete checkpoint whose files all match the manifest. Each newer checkpoint that
  // fails verification is skipped with a warning naming the file and why, and marked DAMAGED
  // (unless read_only): later loads and retention leave it alone. nullopt when none verifies,
  // after logging "starting from scratch" and which damaged ones are kept. One removed by
  // another writer's retention while it is read is not damaged: the listing is read again.
  std::optional<LoadedCheckpoint> load_latest();

  // One checkpoint by name, verified. Throws CheckpointCorruptError when it is incomplete or a
  // file does not match its manifest.
  LoadedCheckpoint load(const std::string& name);

  // The pieces of load(), for readers that stream a checkpoint file by file (FSDP: each rank
  // reads only the shards it needs). read_manifest throws CheckpointCorruptError when the
  // checkpoint is incomplete or its manifest malformed; read_file when the file is missing or
  // does not match its digest, naming the file.
  Manifest read_manifest(const std::string& name);
  std::string read_file(const Manifest& manifest, const std::string& file);
  // Checks one file against its manifest entry (size and SHA-256) without holding it: the file is
  // read in pieces of `piece_bytes` (Storage::read_range) through the hash. For readers that then
  // read parts of the file by ranges (Note [Reading parameters by ranges]). Throws like read_file.
  void verify_file(const Manifest& manifest,
                   const std::string& file,
                   std::uint64_t piece_bytes = 64ull << 20);
  // Marks checkpoint `name` DAMAGED (`why` is kept in the marker), so that loads and retention
  // leave it alone; logs instead of throwing when the marker cannot be written. A reader only
  // logs.
  void mark_damaged(const std::string& name, const std::string& why) noexcept;
  // Marks complete checkpoint `name` as the run's best by `metric` (lower is better, e.g. an
  // eval loss; kept in the marker with `why`): retention keeps it beyond num_to_keep until
  // another is marked best, which unmarks it (and removes it when num_to_keep no longer keeps
  // it). Writers only.
  void mark_best(const std::string& name, double metric, const std::string& why);
  // The checkpoint marked best and its metric, if any: what a resumed run has to beat.
  struct Best {
    std::string name;
    double metric = 0;
  };
  std::optional<Best> best();

  // Complete checkpoints (manifest present, not marked damaged, not verified), oldest first.
  std::vector<std::string> list_complete();
  // Checkpoints marked DAMAGED by an earlier load, oldest first.
  std::vector<std::string> list_damaged();

  storage::Storage& storage() { return *storage_; }
  // This writer (job instance, host, pid); its token names its lease and claims.
  const WriterIdentity& writer() const { return writer_; }

  static constexpr const char* kManifest = "MANIFEST.json";
  static constexpr const char* kDamaged = "DAMAGED.txt";
  static constexpr const char* kBest = "BEST.txt";
  static constexpr const char* kClaimPrefix = "_claim.";

 private:
  void require_writer(const char* what) const;
  void apply_retention(std::int64_t committed);
  // One pass of load_latest over one listing. A checkpoint removed while it is read ends the
  // pass with removed_meanwhile set when may_rescan, and is skipped (not marked) otherwise.
  std::optional<LoadedCheckpoint> load_latest_listed(bool may_rescan, bool& removed_meanwhile);

  std::unique_ptr<storage::Storage> storage_;
  CheckpointerOptions options_;
  WriterIdentity writer_;
  std::unique_ptr<RunLease> lease_;  // null when read_only
  std::int64_t next_number_ = 0;     // this writer never reuses a number it claimed
  std::thread background_;
  std::optional<std::string> background_name_;
  std::exception_ptr background_error_;
};

// "checkpoint_000012" for 12, and back; checkpoint_number gives -1 for any other name.
std::string checkpoint_name(std::int64_t number);
std::int64_t checkpoint_number(std::string_view name);

// The hex SHA-256 of `data`.
std::string sha256_hex(std::string_view data);

}  // namespace trainyard::checkpoint
