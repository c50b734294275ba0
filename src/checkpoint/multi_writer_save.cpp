#include "trainyard/checkpoint/multi_writer_save.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "trainyard/error.h"
#include "trainyard/heartbeat.h"
#include "trainyard/log.h"

namespace trainyard::checkpoint {
namespace {

constexpr std::string_view kFailed = "!failed: ";  // a store value that carries an error
// How long rank 0 waits for the others to read a committed outcome (Note [Outcome acknowledged]):
// they are alive and polling every 20 ms, so this is only reached when one died just then.
constexpr std::chrono::milliseconds kAckTimeout{10'000};

std::string as_string(const std::vector<std::uint8_t>& v) {
  return {v.begin(), v.end()};
}

}  // namespace

// Note [Multi-writer saves]
// The store keys of the k-th save of a job (each rank counts its own saves, and all ranks save
// in the same order, so they agree on k without talking):
//   trainyard/save/<k>/name        rank 0: the claimed checkpoint name, or "!failed: why"
//   trainyard/save/<k>/files/<r>   rank r: its files' digests as JSON, or "!failed: why"
//   trainyard/save/<k>/outcome     rank 0: "committed", or "!failed: why"
//   trainyard/save/<k>/ack/<r>     rank r: it has read the committed outcome
// Rank 0 commits only when every rank reported digests, and so every file is stored; a rank
// that reports failure makes rank 0 abort the checkpoint (its files are removed, it never
// becomes complete). The store is the job's (one per rendezvous attempt), so keys of an earlier
// attempt never mix with this one's.
//
// Note [Outcome acknowledged]
// The job's store is served by rank 0's process. A save is often a program's last collective
// act: rank 0 publishes "committed", returns and exits, while rank r, which polls for the
// outcome, may not have read it yet, and then meets a closed store ("Connection reset by peer")
// and fails a run that had finished. So each rank acknowledges the committed outcome and rank 0
// waits (up to kAckTimeout, then warns: the checkpoint is committed either way) until all have.
MultiWriterSave::MultiWriterSave(Checkpointer& checkpointer,
                                 c10d::Store& store,
                                 int rank,
                                 int world_size,
                                 MultiWriterSaveOptions options)
    : checkpointer_(checkpointer),
      store_(store),
      rank_(rank),
      world_size_(world_size),
      options_(options) {
  TY_CHECK(rank >= 0 && rank < world_size, "MultiWriterSave: rank ", rank,
           " is outside the world of ", world_size, ".");
  const auto k = store_.add("trainyard/save/count/" + std::to_string(rank), 1);
  prefix_ = "trainyard/save/" + std::to_string(k) + "/";
  if (rank_ == 0) {
    try {
      name_ = checkpointer_.begin();
    } catch (const std::exception& e) {
      publish("name", std::string(kFailed) + e.what());
      finished_ = true;
      throw;
    }
    publish("name", name_);
  } else {
    name_ = wait_for("name", "the checkpoint name from rank 0");
  }
}

MultiWriterSave::~MultiWriterSave() {
  if (!finished_) fail("it stopped before committing (an error on this rank)");
}

void MultiWriterSave::publish(const std::string& key, const std::string& value) {
  store_.set(prefix_ + key, std::vector<std::uint8_t>(value.begin(), value.end()));
}

std::string MultiWriterSave::wait_for(const std::string& key, const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
  while (!store_.check({prefix_ + key})) {
    TY_CHECK_T(TimeoutError, std::chrono::steady_clock::now() < deadline,
               "Checkpoint save on rank ", rank_, " of ", world_size_, ": waited ",
               options_.timeout.count(), " s for ", what,
               ". HINT: is that rank alive? Its log says why it stopped.");
    heartbeat_while_waiting();  // waiting for peers' files is progress (Note [Hang watchdog])
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  auto value = as_string(store_.get(prefix_ + key));
  if (value.starts_with(kFailed)) {
    throw Error(detail::concat("Checkpoint save on rank ", rank_, " of ", world_size_,
                               " failed: ", value.substr(kFailed.size())));
  }
  return value;
}

void MultiWriterSave::fail(const std::string& why) noexcept {
  finished_ = true;
  try {
    publish(rank_ == 0 ? "outcome" : "files/" + std::to_string(rank_),
            detail::concat(kFailed, "rank ", rank_, ": ", why));
    if (rank_ == 0) checkpointer_.abort(name_);
  } catch (const std::exception& e) {
    logger("checkpoint")->error("Could not report the failed save of {}: {}", name_, e.what());
  }
}

void MultiWriterSave::write(const std::string& file, std::string_view bytes) {
  TY_CHECK(!finished_, "MultiWriterSave::write(", file, ") after commit().");
  TY_CHECK(!files_.count(file), "MultiWriterSave: ", file, " written twice.");
  try {
    files_[file] = checkpointer_.write_file(name_, file, bytes);
  } catch (const std::exception& e) {
    fail(detail::concat("writing ", file, ": ", e.what()));
    throw;
  }
}

std::string MultiWriterSave::commit(std::int64_t step) {
  TY_CHECK(!finished_, "MultiWriterSave::commit() called twice.");
  nlohmann::json mine = nlohmann::json::object();
  for (const auto& [file, d] : files_) mine[file] = {{"bytes", d.bytes}, {"sha256", d.sha256}};
  if (rank_ != 0) {
    publish("files/" + std::to_string(rank_), mine.dump());
    finished_ = true;
    wait_for("outcome", "rank 0 to commit " + name_);
    publish("ack/" + std::to_string(rank_), "1");  // Note [Outcome acknowledged]
    return name_;
  }
  try {
    std::map<std::string, FileDigest> all = files_;
    for (int r = 1; r < world_size_; ++r) {
      const auto text = wait_for("files/" + std::to_string(r),
                                 "rank " + std::to_string(r) + "'s files of " + name_);
      const auto theirs = nlohmann::json::parse(text);
      for (const auto& [file, d] : theirs.items()) {
        TY_CHECK_T(Error, !all.count(file), "Checkpoint ", name_, ": ranks ", r,
                   " and another both wrote ", file, ". HINT: give each rank's files its rank.");
        all[file] = FileDigest{.bytes = d.at("bytes").get<std::uint64_t>(),
                               .sha256 = d.at("sha256").get<std::string>()};
      }
    }
    checkpointer_.commit(name_, step, all);
  } catch (const std::exception& e) {
    fail(e.what());
    throw;
  }
  publish("outcome", "committed");
  finished_ = true;
  // See Note [Outcome acknowledged].
  std::vector<std::string> acks;
  for (int r = 1; r < world_size_; ++r) acks.push_back(prefix_ + "ack/" + std::to_string(r));
  if (!acks.empty()) {
    try {
      store_.wait(acks, kAckTimeout);
    } catch (const std::exception& e) {
      logger("checkpoint")
          ->warn("{} is committed, but not every rank said it read that within {} s: {}", name_,
                 std::chrono::duration_cast<std::chrono::seconds>(kAckTimeout).count(), e.what());
    }
  }
  return name_;
}

}  // namespace trainyard::checkpoint
