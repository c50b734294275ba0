// A rank's metrics as a file its agent reads: FilePublisher writes, read_rank_files reads.
#include "trainyard/metrics/rank_files.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "trainyard/error.h"
#include "trainyard/log.h"
#include "trainyard/metrics/registry.h"

namespace trainyard::metrics {

namespace fs = std::filesystem;

namespace {

constexpr std::chrono::minutes kWarningInterval{1};
constexpr std::string_view kPrefix = "rank_";
constexpr std::string_view kSuffix = ".json";

// The rank a file named exactly "rank_<N>.json" holds, or nullopt for any other name (temporary
// files are ".rank_<N>.json.tmp.<pid>.<publisher>", so they never match).
std::optional<int> rank_of_file_name(const std::string& name) {
  if (name.size() <= kPrefix.size() + kSuffix.size()) return std::nullopt;
  if (name.compare(0, kPrefix.size(), kPrefix) != 0) return std::nullopt;
  if (name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0) return std::nullopt;
  const char* first = name.data() + kPrefix.size();
  const char* last = name.data() + name.size() - kSuffix.size();
  int rank = -1;
  const auto [end, ec] = std::from_chars(first, last, rank);
  if (ec != std::errc() || end != last || rank < 0) return std::nullopt;
  return rank;
}

bool is_our_temp_file(const std::string& name) {
  return name.size() > 1 && name[0] == '.' && name.find(".tmp.") != std::string::npos &&
         name.compare(1, kPrefix.size(), kPrefix) == 0;
}

// Whether a warning keyed `key` may be logged now: at most one per key per kWarningInterval.
// Shared by every reader in the process (an agent reads one folder; the map stays small and is
// pruned of stale keys).
bool may_warn_about(const std::string& key) {
  static std::mutex mutex;
  static std::map<std::string, std::chrono::steady_clock::time_point> last_warned;
  std::lock_guard<std::mutex> lock(mutex);
  const auto now = std::chrono::steady_clock::now();
  if (last_warned.size() > 1024)
    std::erase_if(last_warned, [&](const auto& kv) { return now - kv.second >= kWarningInterval; });
  auto it = last_warned.find(key);
  if (it != last_warned.end() && now - it->second < kWarningInterval) return false;
  last_warned[key] = now;
  return true;
}

// Tells apart the temporary files of two publishers of one process (one per publisher).
std::uint64_t next_publisher_id() {
  static std::atomic<std::uint64_t> next{0};
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

std::string rank_file_path(const std::string& dir, int rank) {
  return (fs::path(dir) / detail::concat(kPrefix, rank, kSuffix)).string();
}

// --- FilePublisher -----------------------------------------------------------------------------

struct FilePublisher::Impl {
  const Registry& registry;  // outlives the publisher (the caller's contract)
  FilePublisherOptions options;
  std::string path;
  std::string temp_path;

  std::mutex write_mutex;  // one write at a time (the thread and publish_now)
  std::optional<std::chrono::steady_clock::time_point> last_warning;  // guarded by write_mutex

  std::mutex mutex;
  std::condition_variable wake;
  bool stopping = false;  // guarded by mutex
  bool stopped = false;   // guarded by mutex
  std::thread thread;

  Impl(const Registry& r, FilePublisherOptions o)
      : registry(r),
        options(std::move(o)),
        path(rank_file_path(options.dir, options.rank)),
        temp_path(
            (fs::path(options.dir) /
             detail::concat(
                 ".", kPrefix, options.rank, kSuffix, ".tmp.", getpid(), ".", next_publisher_id()))
                .string()) {}

  // Writes the snapshot to the temporary name and renames it over the rank file; throws Error.
  void write_file() {
    const std::string text = snapshot_json(registry.snapshot());
    std::error_code ec;
    fs::create_directories(options.dir, ec);
    if (ec)
      throw Error(detail::concat("Cannot create the metrics folder ", options.dir, ": ",
                                 ec.message(), "."));
    {
      std::ofstream out(temp_path, std::ios::binary | std::ios::trunc);
      if (!out)
        throw Error(
            detail::concat("Cannot open ", temp_path, " for writing: ", std::strerror(errno), "."));
      out << text;
      out.flush();
      if (!out) throw Error(detail::concat("Cannot write ", temp_path, "."));
    }
    fs::rename(temp_path, path, ec);
    if (ec) {
      fs::remove(temp_path, ec);
      throw Error(detail::concat("Cannot rename ", temp_path, " to ", path, "."));
    }
  }

  // Never throws: a failure is logged at most once per kWarningInterval.
  void publish() noexcept {
    std::lock_guard<std::mutex> lock(write_mutex);
    try {
      write_file();
    } catch (const std::exception& e) {
      const auto now = std::chrono::steady_clock::now();
      if (!last_warning || now - *last_warning >= kWarningInterval) {
        last_warning = now;
        try {
          logger("metrics")->warn(
              "rank {}'s metrics were not published (tried again every {} ms; this warning at "
              "most every minute): {}",
              options.rank, options.interval.count(), e.what());
        } catch (...) {
        }
      }
    } catch (...) {
    }
  }

  void run() {
    publish();
    std::unique_lock<std::mutex> lock(mutex);
    while (!stopping) {
      if (wake.wait_for(lock, options.interval, [&] { return stopping; })) break;
      lock.unlock();
      publish();
      lock.lock();
    }
  }
};

FilePublisher::FilePublisher(const Registry& registry, FilePublisherOptions options) {
  TY_CHECK(!options.dir.empty(),
           "FilePublisherOptions.dir is empty; give the folder the rank's metrics file goes to "
           "(the agent sets TRAINYARD_METRICS_DIR).");
  TY_CHECK(options.rank >= 0, "FilePublisherOptions.rank is ", options.rank,
           "; a rank is 0 or more.");
  TY_CHECK(options.interval.count() > 0, "FilePublisherOptions.interval is ",
           options.interval.count(), " ms; it must be positive (the default is ",
           kDefaultPublishInterval.count(), " ms).");
  impl_ = std::make_unique<Impl>(registry, std::move(options));
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

FilePublisher::~FilePublisher() {
  stop();
}

void FilePublisher::publish_now() {
  impl_->publish();
}

void FilePublisher::stop() noexcept {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (impl_->stopped) return;
    impl_->stopped = true;
    impl_->stopping = true;
  }
  impl_->wake.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->publish();
}

// --- reading -----------------------------------------------------------------------------------

std::vector<RankSnapshot> read_rank_files(const std::string& dir) {
  std::vector<RankSnapshot> out;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) {
    if (ec != std::errc::no_such_file_or_directory && may_warn_about(dir))
      logger("metrics")->warn("The metrics folder {} cannot be read: {}.", dir, ec.message());
    return out;
  }
  for (const fs::directory_entry& entry : it) {
    const std::string name = entry.path().filename().string();
    const std::optional<int> rank = rank_of_file_name(name);
    if (!rank) continue;
    const std::string file = entry.path().string();
    try {
      std::ifstream in(file, std::ios::binary);
      if (!in) {
        if (errno == ENOENT) continue;  // removed since the listing
        throw Error(detail::concat("Cannot open ", file, ": ", std::strerror(errno), "."));
      }
      std::ostringstream text;
      text << in.rdbuf();
      out.push_back(RankSnapshot{*rank, snapshot_from_json(text.str(), file)});
    } catch (const std::exception& e) {
      if (may_warn_about(file))
        logger("metrics")->warn("Rank {}'s metrics file is skipped: {}", *rank, e.what());
    }
  }
  std::sort(out.begin(), out.end(),
            [](const RankSnapshot& a, const RankSnapshot& b) { return a.rank < b.rank; });
  return out;
}

void clear_rank_files(const std::string& dir) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return;  // a missing folder has no rank files
  for (const fs::directory_entry& entry : it) {
    const std::string name = entry.path().filename().string();
    if (!rank_of_file_name(name) && !is_our_temp_file(name)) continue;
    std::error_code remove_ec;
    fs::remove(entry.path(), remove_ec);
    if (remove_ec && may_warn_about(entry.path().string()))
      logger("metrics")->warn("The old metrics file {} could not be removed: {}.",
                              entry.path().string(), remove_ec.message());
  }
}

}  // namespace trainyard::metrics
