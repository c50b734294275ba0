// One checkpoint written by every rank of a job: each writes its own files, rank 0 commits the
// manifest once all have written. The ranks agree through the job's store (no collective on the
// process group, so no rank waits for another's file to finish except rank 0 before it commits).
//
//   checkpoint::MultiWriterSave save(checkpointer, *dist->store(), rank, world);
//   save.write("shard_00001_of_00002.safetensors", bytes);   // this rank's files
//   std::string name = save.commit(step);                      // on every rank
//
// Every rank needs its own Checkpointer on the run's folder with the same job instance (Note [Run
// lease]). A rank that fails, or is destroyed before commit(), reports its error through the
// store: rank 0 then removes the partial checkpoint and every rank's commit() throws, naming the
// rank and its error. So either all ranks return the name of a complete checkpoint or all throw.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "trainyard/checkpoint/checkpointer.h"

namespace c10d {
class Store;
}

namespace trainyard::checkpoint {

struct MultiWriterSaveOptions {
  // How long a rank waits for the others' files (rank 0, before committing) or for rank 0's
  // verdict. Writing a large shard to S3 takes minutes; a dead rank is the launcher's to notice.
  std::chrono::seconds timeout{1800};
};

class MultiWriterSave {
 public:
  // Collective over the job's ranks, in the same order of saves on each: rank 0 claims the
  // checkpoint number (Checkpointer::begin), the others learn it. `checkpointer` and `store`
  // outlive this object.
  MultiWriterSave(Checkpointer& checkpointer,
                  c10d::Store& store,
                  int rank,
                  int world_size,
                  MultiWriterSaveOptions options = {});
  ~MultiWriterSave();  // before commit(): reports failure, so the checkpoint is removed
  MultiWriterSave(const MultiWriterSave&) = delete;
  MultiWriterSave& operator=(const MultiWriterSave&) = delete;

  const std::string& name() const { return name_; }
  // Stores one of this rank's files; file names must differ between ranks.
  void write(const std::string& file, std::string_view bytes);
  // Every rank: publishes its digests; rank 0 waits for all, writes the manifest (recording
  // `step`) and publishes the outcome, which every rank returns or throws.
  std::string commit(std::int64_t step);

 private:
  void publish(const std::string& key, const std::string& value);
  std::string wait_for(const std::string& key, const std::string& what);
  void fail(const std::string& why) noexcept;

  Checkpointer& checkpointer_;
  c10d::Store& store_;
  int rank_;
  int world_size_;
  MultiWriterSaveOptions options_;
  std::string prefix_;  // the store keys of this save
  std::string name_;
  std::map<std::string, FileDigest> files_;
  bool finished_ = false;
};

}  // namespace trainyard::checkpoint
