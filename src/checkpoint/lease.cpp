// RunLease: the lease objects under `_lease/`, their acquisition, renewal and check.
#include "trainyard/checkpoint/lease.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "trainyard/error.h"
#include "trainyard/log.h"

namespace trainyard::checkpoint {

using storage::join_uri;
using storage::Storage;
namespace {

constexpr std::string_view kLeasePrefix = "_lease/";

// Note [Run lease]
// Two jobs writing one run folder would delete each other's checkpoints, so a Checkpointer that
// writes holds a lease: an object `_lease/<token>.json` = {writer, renewed_unix}, renewed every
// lease_timeout / 3. Acquiring writes our lease first and lists the leases after: of two
// writers racing, the one that lists later sees the other's lease, so they never both win (both
// may lose; each then says who holds the folder). Leases of our own job instance (every rank of
// one job, and its restarts: $TRAINYARD_JOB_INSTANCE) coexist: the ranks of one job may all
// write into one checkpoint (FSDP), and a restarted rank continues its job at once. A foreign
// lease is abandoned when it was not renewed for lease_timeout (by its holder's clock: hosts
// must agree within seconds, as NTP keeps them), or when its holder is a process of this host,
// same boot and pid namespace, that no longer exists (kill(pid, 0) == ESRCH, or a zombie);
// abandoned leases are removed. Any other foreign lease refuses us. Before a manifest is written,
// check() makes sure our lease is still there and no live foreign one appeared: a writer that lost
// its lease (paused past the timeout, taken over) never commits over the new owner's checkpoints.
// The renewal thread does not recreate a lease that vanished: it marks it lost.

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string read_process_space() {
  struct stat st {};
  const std::string pidns =
      ::stat("/proc/self/ns/pid", &st) == 0 ? std::to_string(st.st_ino) : std::string("?");
  return read_first_line("/proc/sys/kernel/random/boot_id") + "/" + pidns;
}

std::string hostname() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown-host";
  return buf;
}

std::string local_time(std::time_t t) {
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S %Z", &tm);
  return buf;
}

std::int64_t now_unix() {
  return static_cast<std::int64_t>(std::time(nullptr));
}

nlohmann::json to_json(const WriterIdentity& w) {
  return {{"token", w.token}, {"job_instance", w.job_instance},
          {"host", w.host},   {"process_space", w.process_space},
          {"pid", w.pid},     {"started", w.started}};
}

WriterIdentity writer_from_json(const nlohmann::json& j) {
  return WriterIdentity{.token = j.value("token", ""),
                        .job_instance = j.value("job_instance", ""),
                        .host = j.value("host", ""),
                        .process_space = j.value("process_space", ""),
                        .pid = j.value("pid", std::int64_t{0}),
                        .started = j.value("started", "")};
}

std::string describe_lease(const LeaseRecord& l) {
  return detail::concat(l.writer.describe(), ", last renewed ", now_unix() - l.renewed_unix,
                        " s ago");
}

}  // namespace

WriterIdentity WriterIdentity::current() {
  static const std::string host = hostname();
  static const std::string space = read_process_space();
  std::random_device rd;
  char token[33];
  std::snprintf(token, sizeof token, "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  WriterIdentity w{.token = token,
                   .host = host,
                   .process_space = space,
                   .pid = static_cast<std::int64_t>(::getpid()),
                   .started = local_time(std::time(nullptr))};
  const char* job = std::getenv(kJobInstanceEnv);
  w.job_instance =
      job != nullptr && *job != '\0' ? std::string(job) : detail::concat(host, ":", w.pid);
  return w;
}

std::string WriterIdentity::describe() const {
  return detail::concat("host ", host, ", pid ", pid, ", started ", started, " (job instance ",
                        job_instance, ")");
}

std::vector<LeaseRecord> list_leases(Storage& storage) {
  std::vector<LeaseRecord> out;
  for (const auto& key : storage.list(std::string(kLeasePrefix))) {
    const auto text = storage.read(key);
    if (!text) continue;  // released meanwhile
    try {
      const auto j = nlohmann::json::parse(*text);
      out.push_back(LeaseRecord{.key = key,
                                .writer = writer_from_json(j.at("writer")),
                                .renewed_unix = j.at("renewed_unix").get<std::int64_t>(),
                                .lease_timeout_s = j.value("lease_timeout_s", std::int64_t{0})});
    } catch (const std::exception& e) {
      logger("checkpoint")
          ->warn("Ignoring the unreadable lease {}: {}", join_uri(storage.uri(), key), e.what());
    }
  }
  return out;
}

bool lease_abandoned(const LeaseRecord& lease, std::chrono::seconds timeout) {
  // The holder renews every third of its own lease_timeout, which may be longer than ours.
  if (now_unix() - lease.renewed_unix >
      std::max<std::int64_t>(timeout.count(), lease.lease_timeout_s))
    return true;
  const auto& here = WriterIdentity::current();  // host and process space are cached
  if (lease.writer.host != here.host || lease.writer.process_space != here.process_space ||
      lease.writer.pid <= 0) {
    return false;
  }
  if (::kill(static_cast<pid_t>(lease.writer.pid), 0) != 0) return errno == ESRCH;
  // A zombie (killed, not yet reaped by its parent) is gone as well.
  const std::string stat =
      read_first_line(detail::concat("/proc/", lease.writer.pid, "/stat").c_str());
  const auto paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() &&
         (stat[paren + 2] == 'Z' || stat[paren + 2] == 'X');
}

RunLease::RunLease(Storage* storage, WriterIdentity writer, RunLeaseOptions options)
    : storage_(storage),
      writer_(std::move(writer)),
      options_(options),
      key_(detail::concat(kLeasePrefix, writer_.token, ".json")) {
  TY_CHECK(options_.lease_timeout.count() >= 3,
           "RunLeaseOptions.lease_timeout = ", options_.lease_timeout.count(),
           " s must be at least 3 s (it is renewed every third).");
  // See Note [Run lease]: ours first, then the listing.
  write_record();
  std::optional<LeaseRecord> holder;
  try {
    for (const auto& lease : list_leases(*storage_)) {
      if (lease.key == key_) continue;
      if (lease_abandoned(lease, options_.lease_timeout)) {
        logger("checkpoint")
            ->warn("Taking over {}: the lease of {} is abandoned.", storage_->uri(),
                   describe_lease(lease));
        storage_->remove(lease.key);
      } else if (lease.writer.job_instance != writer_.job_instance && !holder) {
        holder = lease;
      }
    }
  } catch (...) {
    try {
      storage_->remove(key_);
    } catch (...) {
    }
    throw;
  }
  if (holder) {
    try {
      storage_->remove(key_);
    } catch (const std::exception& e) {
      logger("checkpoint")->warn("Could not remove our lease {}: {}", key_, e.what());
    }
    throw Error(detail::concat(
        "The run folder ", storage_->uri(), " is in use by another job: ", describe_lease(*holder),
        ". Two jobs writing one run folder would delete each other's checkpoints. HINT: wait for "
        "that job to end (its lease is taken over ",
        options_.lease_timeout.count(),
        " s after its last renewal, or at once on this host once its process is gone), or give "
        "this run another --name (or --storage)."));
  }
  renewer_ = std::thread([this] { renew_loop(); });
}

RunLease::~RunLease() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (renewer_.joinable()) renewer_.join();
  if (lost_) return;  // not ours any more
  try {
    storage_->remove(key_);
  } catch (const std::exception& e) {
    logger("checkpoint")
        ->warn("Could not release the lease {}: {} It expires after {} s.",
               join_uri(storage_->uri(), key_), e.what(), options_.lease_timeout.count());
  }
}

void RunLease::write_record() {
  const nlohmann::json record = {{"writer", to_json(writer_)},
                                 {"renewed_unix", now_unix()},
                                 {"lease_timeout_s", options_.lease_timeout.count()}};
  storage_->write(key_, record.dump(2) + "\n");
}

void RunLease::renew_loop() {
  const auto period = options_.lease_timeout / 3;
  std::unique_lock<std::mutex> lock(mu_);
  while (!wake_.wait_for(lock, period, [this] { return stop_; })) {
    lock.unlock();
    try {
      if (!storage_->read(key_)) {
        lost_ = true;
        logger("checkpoint")
            ->error(
                "The lease {} of this writer vanished (taken over as abandoned?); this "
                "writer will not commit checkpoints any more.",
                join_uri(storage_->uri(), key_));
        return;
      }
      write_record();
      // A taker-over may have removed our lease between the read and the write, which then
      // wrote it again: its own lease, written before it removed ours, is listed now.
      for (const auto& other : list_leases(*storage_)) {
        if (other.key != key_ && other.writer.job_instance != writer_.job_instance &&
            !lease_abandoned(other, options_.lease_timeout)) {
          lost_ = true;
          storage_->remove(key_);
          logger("checkpoint")
              ->error(
                  "The lease of {} was taken over by {}; this writer will not commit "
                  "checkpoints any more.",
                  storage_->uri(), describe_lease(other));
          return;
        }
      }
    } catch (const std::exception& e) {
      logger("checkpoint")
          ->warn(
              "Could not renew the lease {}: {} Retrying in {} s; it expires {} s after the "
              "last renewal.",
              join_uri(storage_->uri(), key_), e.what(), period.count(),
              options_.lease_timeout.count());
    }
    lock.lock();
  }
}

void RunLease::check() {
  if (lost_) {
    throw Error(detail::concat("This writer (", writer_.describe(), ") lost its lease of ",
                               storage_->uri(),
                               ": it was not renewed in time and was taken over. HINT: another "
                               "job may be writing there now; see its log."));
  }
  bool mine = false;
  for (const auto& lease : list_leases(*storage_)) {
    if (lease.key == key_) {
      mine = true;
    } else if (lease.writer.job_instance != writer_.job_instance &&
               !lease_abandoned(lease, options_.lease_timeout)) {
      throw Error(detail::concat("This writer (", writer_.describe(), ") lost the lease of ",
                                 storage_->uri(), " to ", describe_lease(lease),
                                 "; the checkpoint is not committed. HINT: two jobs write to one "
                                 "run folder; give one of them another --name."));
    }
  }
  if (!mine) {
    lost_ = true;
    throw Error(detail::concat(
        "This writer (", writer_.describe(), ") lost its lease of ", storage_->uri(), ": ", key_,
        " is gone (taken over as abandoned after ", options_.lease_timeout.count(),
        " s without renewal?); the checkpoint is not committed."));
  }
}

}  // namespace trainyard::checkpoint
