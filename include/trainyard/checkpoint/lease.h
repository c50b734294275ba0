// RunLease: a run owns its checkpoint folder. Each writer keeps a small lease object under
// `_lease/` in the run's storage, renewed from a background thread; a writer of another job is
// refused while a live lease of a foreign job is there. See Note [Run lease] in lease.cpp.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "trainyard/storage/storage.h"
#include "trainyard/env.h"

namespace trainyard::checkpoint {

// The job instance comes from kJobInstanceEnv (env.h): the same value in every rank
// process of one job, across its restarts, and different between two separately launched jobs.
// Set by the launcher; when absent, a process is a job of its own.
using trainyard::kJobInstanceEnv;

// Who writes: stored in leases, claims and manifests.
struct WriterIdentity {
  std::string token;          // random, one per Checkpointer: names its lease and claims
  std::string job_instance;   // $TRAINYARD_JOB_INSTANCE, else "<host>:<pid>"
  std::string host;           // gethostname()
  std::string process_space;  // boot id and pid namespace: where `pid` means this process
  std::int64_t pid = 0;
  std::string started;  // local time, "2024-05-01 12:00:01"

  // This process, with a fresh token; job_instance from kJobInstanceEnv when it is set.
  static WriterIdentity current();
  std::string describe() const;  // "host h1, pid 42, started 2024-05-01 12:00:01 (job j7)"
};

// A lease as stored under `_lease/<token>.json`.
struct LeaseRecord {
  std::string key;  // "_lease/<token>.json"
  WriterIdentity writer;
  std::int64_t renewed_unix = 0;     // seconds since the epoch, the holder's clock
  std::int64_t lease_timeout_s = 0;  // the holder's lease_timeout; 0 in older leases
};

struct RunLeaseOptions {
  std::chrono::seconds lease_timeout{30};  // a lease not renewed for this long is abandoned
};

// The leases stored now. A record that does not parse is skipped with a warning.
std::vector<LeaseRecord> list_leases(storage::Storage& storage);

// True when `lease` can no longer be held by a live writer: not renewed within `timeout`, or
// held by a process of this host (same boot and pid namespace) that no longer exists.
bool lease_abandoned(const LeaseRecord& lease, std::chrono::seconds timeout);

class RunLease {
 public:
  // Writes this writer's lease, then reads all leases: abandoned ones are removed; a live lease
  // of another job instance makes the constructor remove its own and throw Error naming that
  // holder. Blocks on storage calls; starts the renewal thread (every lease_timeout / 3).
  // `storage` must outlive this object and be thread-safe.
  RunLease(storage::Storage* storage, WriterIdentity writer, RunLeaseOptions options = {});
  // Stops renewing and removes the lease object (best effort; never throws).
  ~RunLease();
  RunLease(const RunLease&) = delete;
  RunLease& operator=(const RunLease&) = delete;

  // Throws Error when this lease was lost: its object is gone (a writer took it over as
  // abandoned) or a live lease of another job instance is there. Call before committing a
  // checkpoint. Blocks on one listing and a read per lease.
  void check();

  const WriterIdentity& writer() const { return writer_; }
  const std::string& key() const { return key_; }

 private:
  void write_record();
  void renew_loop();

  storage::Storage* const storage_;  // owned by the Checkpointer, which outlives this lease
  const WriterIdentity writer_;
  const RunLeaseOptions options_;
  const std::string key_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;              // guarded by mu_
  std::atomic<bool> lost_{false};  // set by the renewal thread when its object vanished
  std::thread renewer_;
};

}  // namespace trainyard::checkpoint
