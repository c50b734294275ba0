// Checkpoints of a training run on a Storage (a directory, file:///dir or s3://bucket/prefix).
//
// Layout under the run's URI:
//   checkpoint_000003/model.pt, optimizer.pt, state.json, ...   the files, any names
//   checkpoint_000003/MANIFEST.json                              written last
// A checkpoint is complete when its manifest exists; the manifest records the step and the size
// and SHA-256 of every file, so a torn, truncated or corrupted file is detected on load. Saving
// writes each file atomically (Storage::write) and the manifest after all of them: a save killed
// halfway leaves no manifest and is never picked. Numbers only grow, so a half-written
// checkpoint's name is never reused.
#pragma once

#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "trainyard/checkpoint/storage.h"

namespace trainyard::checkpoint {

struct CheckpointerOptions {
  int num_to_keep = 0;  // keep the newest K complete checkpoints; 0 keeps all
};

struct Checkpoint {
  std::int64_t step = 0;                       // the training step counter when it was taken
  std::map<std::string, std::string> files{};  // file name -> contents
};

struct LoadedCheckpoint {
  std::string name;  // "checkpoint_000003"
  Checkpoint checkpoint;
};

class Checkpointer {
 public:
  // `uri` is the run's folder; it need not exist yet.
  explicit Checkpointer(const std::string& uri, CheckpointerOptions options = {});
  Checkpointer(std::unique_ptr<Storage> storage, CheckpointerOptions options = {});
  ~Checkpointer();

  // Writes a new checkpoint and returns its name, then removes complete checkpoints beyond
  // num_to_keep and the leftovers of saves that never completed. Throws Error when a write fails;
  // the checkpoint is then incomplete and ignored by loads.
  std::string save(const Checkpoint& checkpoint);

  // save() on a background thread, so that training goes on while the files are written: waits
  // for the previous background save (rethrowing its error), then returns at once. At most one
  // save runs at a time; a process killed meanwhile leaves an incomplete checkpoint, which loads
  // never pick.
  void save_in_background(Checkpoint checkpoint);
  // Waits for the background save, if any, and returns its name; rethrows its error.
  std::optional<std::string> wait();

  // The newest complete checkpoint whose files all match the manifest. Each newer checkpoint that
  // fails verification is skipped with a warning naming the file and why. nullopt when none.
  std::optional<LoadedCheckpoint> load_latest();

  // One checkpoint by name, verified. Throws CheckpointCorruptError when it is incomplete or a
  // file does not match its manifest.
  LoadedCheckpoint load(const std::string& name);

  // Complete checkpoints (manifest present, not verified), oldest first.
  std::vector<std::string> list_complete();

  Storage& storage() { return *storage_; }

  static constexpr const char* kManifest = "MANIFEST.json";

 private:
  std::unique_ptr<Storage> storage_;
  CheckpointerOptions options_;
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
