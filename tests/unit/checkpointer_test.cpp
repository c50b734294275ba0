// Checkpointer and FileStorage: atomic saves with a manifest written last, SHA-256 verification
// on load, skipping corrupt or partial checkpoints, retention, and a save killed halfway; the run
// lease (a second job refused, abandoned leases taken over), numbers claimed by racing writers,
// retention sparing live writers' saves, failed saves cleaned up, damaged checkpoints kept, and
// one checkpoint written by several writers.
#include "trainyard/checkpoint/checkpointer.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <atomic>
#include <ctime>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "../log_capture.h"
#include "../temp_dir.h"
#include "../text.h"
#include "trainyard/checkpoint/lease.h"
#include "trainyard/error.h"
#include "trainyard/log.h"
#include "trainyard/storage/storage.h"

namespace trainyard::checkpoint {
namespace {
using storage::join_uri;
using storage::open_storage;
using storage::Storage;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

using trainyard::test::contains;
using trainyard::test::LogCapture;
using trainyard::test::TempDir;

Checkpoint make(std::int64_t step, std::size_t bytes = 1000) {
  Checkpoint c{.step = step};
  c.files["model.pt"] = std::string(bytes, static_cast<char>('a' + step % 26));
  c.files["state.json"] = "{\"step\": " + std::to_string(step) + "}";
  return c;
}

void overwrite_byte(const fs::path& file, std::size_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put('#');
}

TEST(Checkpointer, SavesAndLoadsTheNewest) {
  TempDir dir;
  Checkpointer c(dir.path().string());
  EXPECT_FALSE(c.load_latest().has_value());
  EXPECT_EQ(c.save(make(4)), "checkpoint_000000");
  EXPECT_EQ(c.save(make(8)), "checkpoint_000001");
  auto latest = c.load_latest();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->name, "checkpoint_000001");
  EXPECT_EQ(latest->checkpoint.step, 8);
  EXPECT_EQ(latest->checkpoint.files, make(8).files);
  EXPECT_TRUE(fs::exists(dir.path() / "checkpoint_000001" / "MANIFEST.json"));
  EXPECT_EQ(c.list_complete(),
            (std::vector<std::string>{"checkpoint_000000", "checkpoint_000001"}));
}

TEST(Checkpointer, KeepsTheNewestNumToKeep) {
  TempDir dir;
  Checkpointer c("file://" + dir.path().string(), {.num_to_keep = 2});
  for (int step = 1; step <= 4; ++step) c.save(make(step));
  EXPECT_EQ(c.list_complete(),
            (std::vector<std::string>{"checkpoint_000002", "checkpoint_000003"}));
  EXPECT_FALSE(fs::exists(dir.path() / "checkpoint_000000"));
  EXPECT_FALSE(fs::exists(dir.path() / "checkpoint_000001"));
}

// The run's best (mark_best) stays beyond num_to_keep until another is marked, which frees it.
TEST(Checkpointer, KeepsTheBestBeyondNumToKeepUntilAnotherIsBest) {
  TempDir dir;
  Checkpointer c(dir.path().string(), {.num_to_keep = 1});
  c.save(make(1));
  c.mark_best("checkpoint_000000", 2.1, "eval_epoch_loss after epoch 1");
  c.save(make(2));
  c.save(make(3));
  EXPECT_EQ(c.list_complete(),
            (std::vector<std::string>{"checkpoint_000000", "checkpoint_000002"}));
  ASSERT_TRUE(c.best().has_value());
  EXPECT_EQ(c.best()->name, "checkpoint_000000");
  EXPECT_EQ(c.best()->metric, 2.1) << "what a resumed run must beat";
  c.mark_best("checkpoint_000002", 1.9, "eval_epoch_loss after epoch 3");
  EXPECT_EQ(c.best()->name, "checkpoint_000002");
  EXPECT_EQ(c.best()->metric, 1.9);
  EXPECT_EQ(c.list_complete(), (std::vector<std::string>{"checkpoint_000002"}))
      << "the former best goes at once";
  c.save(make(4));
  EXPECT_EQ(c.list_complete(),
            (std::vector<std::string>{"checkpoint_000002", "checkpoint_000003"}));
  EXPECT_THROW(c.mark_best("checkpoint_000009", 1.0, "none"), InvalidArgumentError);
}

TEST(Checkpointer, SkipsACorruptNewestCheckpoint) {
  TempDir dir;
  Checkpointer c(dir.path().string());
  c.save(make(1));
  c.save(make(2));
  overwrite_byte(dir.path() / "checkpoint_000001" / "model.pt", 10);
  try {
    c.load("checkpoint_000001");
    FAIL() << "a corrupt file must not load";
  } catch (const CheckpointCorruptError& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint_000001/model.pt does not match its SHA-256"),
              std::string::npos)
        << e.what();
  }
  auto latest = c.load_latest();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->name, "checkpoint_000000");
  EXPECT_EQ(latest->checkpoint.step, 1);
}

// verify_file streams a file through the hash in pieces (here 7 bytes, so the file spans many)
// for readers that then read it by ranges.
TEST(Checkpointer, VerifyFileStreamsTheHashAndNamesAChangedOrCutFile) {
  TempDir dir;
  Checkpointer c(dir.path().string());
  c.save(make(1, 1000));
  const auto manifest = c.read_manifest("checkpoint_000000");
  EXPECT_NO_THROW(c.verify_file(manifest, "model.pt", 7));
  EXPECT_NO_THROW(c.verify_file(manifest, "model.pt", 1000));  // exactly one piece
  overwrite_byte(dir.path() / "checkpoint_000000" / "model.pt", 998);
  try {
    c.verify_file(manifest, "model.pt", 7);
    FAIL() << "a changed byte must not verify";
  } catch (const CheckpointCorruptError& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint_000000/model.pt does not match its SHA-256 "
                                         "in the manifest."),
              std::string::npos)
        << e.what();
  }
  fs::resize_file(dir.path() / "checkpoint_000000" / "model.pt", 10);
  try {
    c.verify_file(manifest, "model.pt", 7);
    FAIL() << "a cut file must not verify";
  } catch (const CheckpointCorruptError& e) {
    EXPECT_NE(std::string(e.what()).find("model.pt has 10 bytes; the manifest says 1000."),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(c.verify_file(manifest, "other.bin"), CheckpointCorruptError);
}

TEST(Checkpointer, SkipsTruncatedMissingAndUnreadableCheckpoints) {
  TempDir dir;
  Checkpointer c(dir.path().string());
  c.save(make(1));
  c.save(make(2));
  c.save(make(3));
  c.save(make(4));
  fs::resize_file(dir.path() / "checkpoint_000003" / "model.pt", 10);
  fs::remove(dir.path() / "checkpoint_000002" / "state.json");
  std::ofstream(dir.path() / "checkpoint_000001" / "MANIFEST.json") << "{not json";
  EXPECT_THROW(c.load("checkpoint_000003"), CheckpointCorruptError);
  EXPECT_THROW(c.load("checkpoint_000002"), CheckpointCorruptError);
  EXPECT_THROW(c.load("checkpoint_000001"), CheckpointCorruptError);
  auto latest = c.load_latest();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->name, "checkpoint_000000");
}

// A manifest is what a save wrote or it is refused: a file listed twice (JSON keeps one of two
// repeated keys silently), an entry without its digest, a name that leaves the folder.
TEST(Checkpointer, AManifestListingAFileTwiceOrAnOddEntryIsRefused) {
  TempDir dir;
  Checkpointer c(dir.path().string());
  c.save(make(1));
  const auto manifest_path = dir.path() / "checkpoint_000000" / "MANIFEST.json";
  std::string text;
  std::getline(std::ifstream(manifest_path), text, '\0');
  auto manifest = nlohmann::json::parse(text);
  const auto refused = [&](const std::string& written) {
    std::ofstream(manifest_path, std::ios::trunc) << written;
    try {
      c.load("checkpoint_000000");
    } catch (const CheckpointCorruptError& e) {
      return std::string(e.what());
    }
    return std::string("loaded");
  };
  // "model.pt" a second time, with its own (equal) digest: two keys of one name.
  const std::string model = manifest["files"]["model.pt"].dump();
  std::string twice = manifest.dump();
  twice.replace(twice.find("\"model.pt\""), 0, "\"model.pt\":" + model + ",");
  EXPECT_TRUE(contains(refused(twice), "lists \"model.pt\" twice")) << twice;
  auto no_digest = manifest;
  no_digest["files"]["model.pt"].erase("sha256");
  EXPECT_TRUE(contains(refused(no_digest.dump()), "has the entry \"model.pt\""));
  auto escape = manifest;
  escape["files"]["../model.pt"] = manifest["files"]["model.pt"];
  EXPECT_TRUE(contains(refused(escape.dump()), "has the entry \"../model.pt\""));
  std::ofstream(manifest_path, std::ios::trunc) << text;
  EXPECT_EQ(c.load("checkpoint_000000").checkpoint.step, 1);
}

TEST(Checkpointer, NeverPicksAPartialSaveAndCleansItUp) {
  TempDir dir;
  Checkpointer c(dir.path().string());
  c.save(make(1));
  // A save that died before its manifest: files, one still under its temporary name.
  fs::create_directories(dir.path() / "checkpoint_000001");
  std::ofstream(dir.path() / "checkpoint_000001" / "model.pt") << "half";
  std::ofstream(dir.path() / "checkpoint_000001" / "state.json.tmp.123") << "half";
  EXPECT_EQ(c.load_latest()->name, "checkpoint_000000");
  // The next save takes a fresh number and removes the leftover.
  EXPECT_EQ(c.save(make(2)), "checkpoint_000002");
  EXPECT_FALSE(fs::exists(dir.path() / "checkpoint_000001")) << "temporary files go too";
  EXPECT_EQ(c.load_latest()->checkpoint.step, 2);
}

// Retention removes a checkpoint without a manifest (it never completed), but never silently: the
// log names it, its files and why; a complete one beyond num_to_keep is logged too.
TEST(Checkpointer, RetentionLogsWhatItRemovesAndWhy) {
  TempDir dir;
  Checkpointer c(dir.path().string(), {.num_to_keep = 1});
  c.save(make(1));
  // Intact files whose MANIFEST.json is gone (lost in a copy), claimed by no writer.
  for (const auto& [file, contents] : make(2).files)
    c.storage().write("checkpoint_000001/" + file, contents);
  LogCapture log("checkpoint");
  EXPECT_EQ(c.save(make(3)), "checkpoint_000002");
  const auto text = log.text();
  EXPECT_NE(text.find("Removing " + join_uri(dir.str(), "checkpoint_000001") +
                      " (2 files: model.pt, state.json): it has no MANIFEST.json, so its save "
                      "never completed, and no writer claims it. HINT: a checkpoint counts only "
                      "once its MANIFEST.json is written"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("Removing " + join_uri(dir.str(), "checkpoint_000000") +
                      ": complete, older than the newest 1 that num_to_keep keeps (from "
                      "checkpoint_000002)."),
            std::string::npos)
      << text;
  EXPECT_FALSE(fs::exists(dir.path() / "checkpoint_000001"));
  EXPECT_EQ(c.list_complete(), std::vector<std::string>{"checkpoint_000002"});
}

TEST(Checkpointer, ASaveKilledHalfwayIsNeverPicked) {
  TempDir dir;
  Checkpointer(dir.path().string()).save(make(1));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // saves big checkpoints until killed
    Checkpointer c(dir.path().string());
    for (int step = 2;; ++step) c.save(make(step, 64u << 20));
    _exit(0);
  }
  // Kill it while it writes: as soon as the first big file is being written.
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  bool writing = false;
  while (!writing && std::chrono::steady_clock::now() < deadline) {
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dir.path(), ec); !ec && it != fs::end(it);
         it.increment(ec)) {
      writing = writing || it->path().filename().string().find(".tmp.") != std::string::npos;
    }
    if (!writing) std::this_thread::sleep_for(1ms);
  }
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(writing) << "the child never started writing";
  Checkpointer c(dir.path().string());
  auto latest = c.load_latest();
  ASSERT_TRUE(latest.has_value());
  // Whatever completed before the kill verifies; the save in flight is not listed.
  EXPECT_EQ(c.list_complete().back(), latest->name);
  EXPECT_EQ(latest->checkpoint.files,
            make(latest->checkpoint.step, latest->checkpoint.step == 1 ? 1000 : 64u << 20).files);
}

TEST(Checkpointer, RejectsBadFileNames) {
  TempDir dir;
  Checkpointer c(dir.path().string());
  Checkpoint bad{.step = 1};
  bad.files["a/b"] = "x";
  EXPECT_THROW(c.save(bad), InvalidArgumentError);
  Checkpoint manifest{.step = 1};
  manifest.files["MANIFEST.json"] = "x";
  EXPECT_THROW(c.save(manifest), InvalidArgumentError);
  EXPECT_THROW(Checkpointer(dir.path().string(), {.num_to_keep = -1}), InvalidArgumentError);
}

TEST(Checkpointer, NamesAndNumbers) {
  EXPECT_EQ(checkpoint_name(12), "checkpoint_000012");
  EXPECT_EQ(checkpoint_number("checkpoint_000012"), 12);
  EXPECT_EQ(checkpoint_number("checkpoint_"), -1);
  EXPECT_EQ(checkpoint_number("checkpoint_12a"), -1);
  EXPECT_EQ(checkpoint_number("other_000012"), -1);
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(FileStorage, WritesReadsListsAndRemoves) {
  TempDir dir;
  auto s = open_storage(dir.path().string() + "/runs");
  EXPECT_FALSE(s->read("a/b.txt").has_value());
  EXPECT_TRUE(s->list("").empty()) << "a missing root lists nothing";
  s->write("a/b.txt", "one");
  s->write("a/b.txt", "two");
  s->write("c.txt", std::string("\0x", 2));
  EXPECT_EQ(*s->read("a/b.txt"), "two");
  EXPECT_EQ(*s->read("c.txt"), std::string("\0x", 2));
  EXPECT_EQ(s->list(""), (std::vector<std::string>{"a/b.txt", "c.txt"}));
  EXPECT_EQ(s->list("a/"), (std::vector<std::string>{"a/b.txt"}));
  s->remove("a/b.txt");
  s->remove("a/b.txt");
  EXPECT_FALSE(fs::exists(dir.path() / "runs" / "a")) << "emptied folders go too";
  for (const char* bad : {"", "/abs", "a/../b", "a//b", "./a"}) {
    EXPECT_THROW(s->write(bad, "x"), InvalidArgumentError) << bad;
  }
}

TEST(FileStorage, UnwritableRootIsAClearError) {
  TempDir dir;
  std::ofstream(dir.path() / "plain-file") << "x";  // a file where the root's folder should be
  auto s = open_storage((dir.path() / "plain-file" / "runs").string());
  try {
    s->write("x", "y");
    FAIL() << "writing below a plain file must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("plain-file/runs"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("HINT"), std::string::npos) << e.what();
  }
}

TEST(OpenStorage, UrisAndSchemes) {
  EXPECT_EQ(open_storage("file:///tmp/x")->uri(), "file:///tmp/x");
  EXPECT_THROW(open_storage("file://relative/x"), InvalidArgumentError);
  EXPECT_THROW(open_storage("gs://bucket/x"), InvalidArgumentError);
  EXPECT_THROW(open_storage(""), InvalidArgumentError);
  EXPECT_EQ(join_uri("s3://b/runs", "job7"), "s3://b/runs/job7");
  EXPECT_EQ(join_uri("s3://b/runs/", "job7"), "s3://b/runs/job7");
  EXPECT_EQ(join_uri("results", "job7"), "results/job7");
}

// ---- run lease, claims, retention, failures (issue 8) ----

std::int64_t now_unix() {
  return static_cast<std::int64_t>(std::time(nullptr));
}

// Writes a lease object by hand, as another writer would have.
void write_lease(Storage& s, const WriterIdentity& w, std::int64_t renewed_unix) {
  const nlohmann::json j = {{"writer",
                             {{"token", w.token},
                              {"job_instance", w.job_instance},
                              {"host", w.host},
                              {"process_space", w.process_space},
                              {"pid", w.pid},
                              {"started", w.started}}},
                            {"renewed_unix", renewed_unix}};
  s.write("_lease/" + w.token + ".json", j.dump());
}

WriterIdentity other_writer(std::string token, std::string job, std::string host = "far-away") {
  return WriterIdentity{.token = std::move(token),
                        .job_instance = std::move(job),
                        .host = std::move(host),
                        .process_space = "other-boot/1",
                        .pid = 4242,
                        .started = "2024-01-02 03:04:05 UTC"};
}

std::size_t count_leases(Storage& s) {
  return s.list("_lease/").size();
}

TEST(Checkpointer, ASecondJobIsRefusedNamingTheHolderAndTouchesNothing) {
  TempDir dir;
  Checkpointer a(dir.path().string(), {.num_to_keep = 1, .job_instance = "job-a"});
  a.save(make(1));
  a.save(make(2));
  const auto files_before = a.storage().list("checkpoint_");
  try {
    Checkpointer b(dir.path().string(), {.num_to_keep = 1, .job_instance = "job-b"});
    FAIL() << "a second job must be refused";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("is in use by another job"), std::string::npos) << msg;
    EXPECT_NE(msg.find("host " + a.writer().host), std::string::npos) << msg;
    EXPECT_NE(msg.find("pid " + std::to_string(getpid())), std::string::npos) << msg;
    EXPECT_NE(msg.find("started " + a.writer().started), std::string::npos) << msg;
    EXPECT_NE(msg.find("job instance job-a"), std::string::npos) << msg;
    EXPECT_NE(msg.find("last renewed"), std::string::npos) << msg;
    EXPECT_NE(msg.find("HINT"), std::string::npos) << msg;
  }
  EXPECT_EQ(a.storage().list("checkpoint_"), files_before) << "the holder's files are untouched";
  EXPECT_EQ(count_leases(a.storage()), 1u) << "the refused writer removed its lease";
  EXPECT_EQ(a.load_latest()->checkpoint.step, 2);
  EXPECT_EQ(a.save(make(3)), "checkpoint_000002") << "the holder goes on";
}

TEST(Checkpointer, AReleasedLeaseLetsTheNextJobIn) {
  TempDir dir;
  { Checkpointer(dir.path().string(), {.job_instance = "job-a"}).save(make(1)); }
  Checkpointer b(dir.path().string(), {.job_instance = "job-b"});
  EXPECT_EQ(b.load_latest()->checkpoint.step, 1);
  EXPECT_EQ(count_leases(b.storage()), 1u);
}

TEST(Checkpointer, AbandonedLeasesAreTakenOver) {
  TempDir dir;
  auto s = open_storage(dir.path().string());
  // Not renewed for longer than the timeout, on another host.
  write_lease(*s, other_writer("stale", "job-old"), now_unix() - 100);
  // Fresh, but its process on this host is gone.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  WriterIdentity dead = Checkpointer(dir.path().string(), {.read_only = true}).writer();
  dead.token = "deadpid";
  dead.job_instance = "job-dead";
  dead.pid = child;
  write_lease(*s, dead, now_unix());
  // Killed but not yet reaped by its parent: a zombie is gone too.
  const pid_t zombie = fork();
  ASSERT_GE(zombie, 0);
  if (zombie == 0) _exit(0);
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, zombie, &info, WEXITED | WNOWAIT), 0);  // exited, still unreaped
  dead.token = "zombie";
  dead.job_instance = "job-zombie";
  dead.pid = zombie;
  write_lease(*s, dead, now_unix());
  Checkpointer c(dir.path().string(), {.lease_timeout = 30s, .job_instance = "job-new"});
  EXPECT_EQ(s->list("_lease/"), std::vector<std::string>{"_lease/" + c.writer().token + ".json"});
  EXPECT_EQ(c.save(make(1)), "checkpoint_000000");
  waitpid(zombie, nullptr, 0);
}

TEST(Checkpointer, ALiveLeaseOfTheSameJobLetsARestartedWriterInAtOnce) {
  TempDir dir;
  auto s = open_storage(dir.path().string());
  write_lease(*s, other_writer("sibling", "job-a"), now_unix());  // e.g. another rank, elsewhere
  {
    Checkpointer c(dir.path().string(), {.job_instance = "job-a"});
    EXPECT_EQ(count_leases(*s), 2u) << "leases of one job coexist";
    EXPECT_EQ(c.save(make(1)), "checkpoint_000000");
  }
  try {
    Checkpointer other(dir.path().string(), {.job_instance = "job-b"});
    FAIL() << "the sibling's live lease still refuses another job";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("host far-away, pid 4242"), std::string::npos) << e.what();
  }
}

TEST(Checkpointer, RacingWritersNeverShareANumber) {
  TempDir dir;
  constexpr int kWriters = 4, kEach = 8;
  std::vector<std::unique_ptr<Checkpointer>> writers;
  for (int i = 0; i < kWriters; ++i) {
    writers.push_back(std::make_unique<Checkpointer>(dir.path().string(),
                                                     CheckpointerOptions{.job_instance = "job-a"}));
  }
  std::mutex mu;
  std::vector<std::string> names;
  std::vector<std::thread> threads;
  for (int i = 0; i < kWriters; ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < kEach; ++k) {
        const auto name = writers[i]->begin();
        std::lock_guard<std::mutex> lock(mu);
        names.push_back(name);
      }
    });
  }
  for (auto& t : threads) t.join();
  const std::set<std::string> unique(names.begin(), names.end());
  EXPECT_EQ(unique.size(), names.size()) << "a number was handed out twice";
  for (const auto& name : unique) {
    EXPECT_EQ(writers[0]->storage().list(name + "/_claim.").size(), 1u) << name;
  }
}

// A folder that another writer removes while list() walks the tree (a withdrawn claim: remove()
// drops the folders it empties) is skipped, as a listing a moment later would not show it. The
// walk used to fail ("Cannot list <root>: No such file or directory"), which ended a racing
// writer's begin() (RacingWritersNeverShareANumber, now and then).
TEST(FileStorage, ListingSkipsFoldersRemovedWhileItWalks) {
  TempDir dir;
  auto lister = open_storage(dir.path().string());
  lister->write("kept/a", "x");
  std::atomic<bool> done{false};
  std::vector<std::thread> churners;
  for (int t = 0; t < 4; ++t) {
    churners.emplace_back([&, t] {
      auto churner = open_storage(dir.path().string());
      for (int i = 0; !done; ++i) {
        const std::string key = "claimed_" + std::to_string(t) + "_" + std::to_string(i % 4) + "/c";
        churner->write(key, "y");
        churner->remove(key);
      }
    });
  }
  std::string failure;
  const auto deadline = std::chrono::steady_clock::now() + 2s;
  int listings = 0;
  while (failure.empty() && std::chrono::steady_clock::now() < deadline) {
    try {
      const auto keys = lister->list("");
      if (std::find(keys.begin(), keys.end(), "kept/a") == keys.end()) failure = "kept/a missing";
      ++listings;
    } catch (const Error& e) {
      failure = e.what();
    }
  }
  done = true;
  for (auto& t : churners) t.join();
  EXPECT_EQ(failure, "") << "after " << listings << " listings";
  EXPECT_GT(listings, 10);
}

TEST(Checkpointer, RetentionSparesAnotherLiveWritersSaveInProgress) {
  TempDir dir;
  Checkpointer a(dir.path().string(), {.num_to_keep = 1, .job_instance = "job-a"});
  a.save(make(1));  // 0
  std::string in_progress;
  {
    Checkpointer b(dir.path().string(), {.job_instance = "job-a"});  // e.g. another rank
    in_progress = b.begin();                                         // 1
    b.write_file(in_progress, "part.pt", "half of it");
    EXPECT_EQ(a.save(make(2)), "checkpoint_000002");
    EXPECT_TRUE(fs::exists(dir.path() / in_progress / "part.pt")) << "b's lease is live";
    EXPECT_FALSE(fs::exists(dir.path() / "checkpoint_000000")) << "beyond num_to_keep";
  }
  // b released its lease without committing: its checkpoint is provably abandoned now.
  EXPECT_EQ(a.save(make(3)), "checkpoint_000003");
  EXPECT_FALSE(fs::exists(dir.path() / in_progress));
  // A foreign claim whose lease went stale is abandoned too; one with no lease at all as well.
  a.storage().write("checkpoint_000004/_claim.ghost", "{}");
  a.storage().write("checkpoint_000004/model.pt", "x");
  write_lease(a.storage(), other_writer("ghost", "job-a"), now_unix() - 1000);
  EXPECT_EQ(a.save(make(5)), "checkpoint_000005");
  EXPECT_FALSE(fs::exists(dir.path() / "checkpoint_000004"));
  EXPECT_EQ(a.list_complete(), std::vector<std::string>{"checkpoint_000005"});
}

TEST(Checkpointer, ALiveForeignLeaseStopsTheCommitAndItsSaveIsLeftAlone) {
  TempDir dir;
  Checkpointer a(dir.path().string(), {.num_to_keep = 1, .job_instance = "job-a"});
  a.save(make(1));
  // Another job got in anyway (a writer that lost its lease keeps running, or a race): its lease
  // and its save in progress.
  write_lease(a.storage(), other_writer("intruder", "job-b"), now_unix());
  a.storage().write("checkpoint_000001/_claim.intruder", "{}");
  a.storage().write("checkpoint_000001/model.pt", "theirs");
  try {
    a.save(make(2));
    FAIL() << "the commit must be refused";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("lost the lease"), std::string::npos) << msg;
    EXPECT_NE(msg.find("host far-away, pid 4242"), std::string::npos) << msg;
  }
  EXPECT_EQ(a.list_complete(), std::vector<std::string>{"checkpoint_000000"});
  EXPECT_FALSE(fs::exists(dir.path() / "checkpoint_000002")) << "its partial files are removed";
  EXPECT_EQ(*a.storage().read("checkpoint_000001/model.pt"), "theirs");
}

TEST(Checkpointer, AWriterWhoseLeaseWasTakenOverCommitsNothing) {
  TempDir dir;
  Checkpointer a(dir.path().string(), {.job_instance = "job-a"});
  a.save(make(1));
  a.storage().remove("_lease/" + a.writer().token + ".json");  // taken over as abandoned
  try {
    a.save(make(2));
    FAIL() << "a writer without its lease must not commit";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lost its lease"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a.list_complete(), std::vector<std::string>{"checkpoint_000000"});
}

// Fails the n-th write (counting from 1) of a checkpoint file; leases and claims pass.
class FailingStorage final : public Storage {
 public:
  FailingStorage(std::unique_ptr<Storage> inner, int fail_at)
      : inner_(std::move(inner)), fail_at_(fail_at) {}
  void write(const std::string& key, std::string_view data) override {
    const bool counted =
        key.starts_with("checkpoint_") && key.find("/_claim.") == std::string::npos;
    if (counted && ++writes_ == fail_at_) {
      throw Error("injected failure writing " + key + " (disk full)");
    }
    inner_->write(key, data);
  }
  std::optional<std::string> read(const std::string& key) override { return inner_->read(key); }
  std::vector<std::string> list(const std::string& prefix) override { return inner_->list(prefix); }
  void remove(const std::string& key) override { inner_->remove(key); }
  void remove_all(const std::string& prefix) override { inner_->remove_all(prefix); }
  std::string uri() const override { return inner_->uri(); }

 private:
  std::unique_ptr<Storage> inner_;
  const int fail_at_;
  std::atomic<int> writes_{0};
};

TEST(Checkpointer, AFailedSaveRemovesItsPartialFiles) {
  TempDir dir;
  Checkpoint big = make(1);
  big.files["optimizer.pt"] = std::string(5000, 'o');
  // Files are written in name order: model.pt, optimizer.pt, state.json; the third fails.
  Checkpointer c(std::make_unique<FailingStorage>(open_storage(dir.path().string()), 3));
  try {
    c.save(big);
    FAIL() << "the injected failure must surface";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint_000000/state.json"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(dir.path() / "checkpoint_000000")) << "partial files stay behind";
  EXPECT_TRUE(c.list_complete().empty());
  const auto name = c.save(make(2));  // the fourth write onwards succeed
  EXPECT_EQ(c.load_latest()->name, name);
  EXPECT_EQ(c.load_latest()->checkpoint.step, 2);
}

TEST(Checkpointer, WhenEveryCheckpointIsDamagedItStartsFromScratchAndKeepsThem) {
  TempDir dir;
  Checkpointer c(dir.path().string(), {.num_to_keep = 1});
  c.save(make(1));
  c.save(make(2));
  EXPECT_EQ(c.list_complete(), std::vector<std::string>{"checkpoint_000001"});
  c.storage().write("checkpoint_000000/model.pt", "left from an older layout");
  c.storage().write("checkpoint_000000/MANIFEST.json", "{not json");
  overwrite_byte(dir.path() / "checkpoint_000001" / "model.pt", 3);
  LogCapture log("checkpoint");
  EXPECT_FALSE(c.load_latest().has_value());
  const auto text = log.text();
  EXPECT_NE(text.find("starting from scratch"), std::string::npos) << text;
  EXPECT_NE(text.find("checkpoint_000000, checkpoint_000001) are kept for inspection"),
            std::string::npos)
      << text;
  const std::vector<std::string> both = {"checkpoint_000000", "checkpoint_000001"};
  EXPECT_EQ(c.list_damaged(), both);
  EXPECT_TRUE(c.list_complete().empty());
  const auto why = c.storage().read("checkpoint_000001/DAMAGED.txt");
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("model.pt does not match its SHA-256"), std::string::npos) << *why;
  // New saves neither count nor remove the damaged ones.
  EXPECT_EQ(c.save(make(3)), "checkpoint_000002");
  EXPECT_EQ(c.save(make(4)), "checkpoint_000003");
  EXPECT_EQ(c.list_damaged(), both);
  EXPECT_EQ(c.list_complete(), std::vector<std::string>{"checkpoint_000003"});
  EXPECT_EQ(c.load_latest()->checkpoint.step, 4);
}

// A storage that runs `hook` once, just before the first read of `key` (another process's work
// landing at that moment).
class StorageWithHook : public Storage {
 public:
  StorageWithHook(std::unique_ptr<Storage> inner, std::string key, std::function<void()> hook)
      : inner_(std::move(inner)), key_(std::move(key)), hook_(std::move(hook)) {}
  void write(const std::string& key, std::string_view data) override { inner_->write(key, data); }
  std::optional<std::string> read(const std::string& key) override {
    if (key == key_ && hook_) std::exchange(hook_, nullptr)();
    return inner_->read(key);
  }
  std::vector<std::string> list(const std::string& prefix) override { return inner_->list(prefix); }
  void remove(const std::string& key) override { inner_->remove(key); }
  std::string uri() const override { return inner_->uri(); }

 private:
  std::unique_ptr<Storage> inner_;
  std::string key_;
  std::function<void()> hook_;
};

TEST(Checkpointer, ACheckpointRemovedByRetentionWhileReadIsNotMarkedDamaged) {
  TempDir dir;
  Checkpointer writer(dir.path().string(), {.num_to_keep = 1, .job_instance = "job-a"});
  writer.save(make(1));
  // A restarted rank of the same job loads checkpoint 0; between its manifest and its files, the
  // writer commits checkpoint 1 and its retention removes checkpoint 0.
  Checkpointer loader(std::make_unique<StorageWithHook>(open_storage(dir.path().string()),
                                                        "checkpoint_000000/model.pt",
                                                        [&] { writer.save(make(2)); }),
                      {.num_to_keep = 1, .job_instance = "job-a"});
  LogCapture logs("checkpoint");
  const auto latest = loader.load_latest();
  ASSERT_TRUE(latest.has_value()) << logs.text();
  EXPECT_EQ(latest->name, "checkpoint_000001");
  EXPECT_EQ(latest->checkpoint.step, 2);
  EXPECT_FALSE(fs::exists(dir.path() / "checkpoint_000000" / Checkpointer::kDamaged));
  EXPECT_NE(logs.text().find("was removed while being read"), std::string::npos) << logs.text();
  EXPECT_EQ(logs.text().find("starting from scratch"), std::string::npos) << logs.text();
}

TEST(Checkpointer, SeveralWritersOfOneJobWriteOneCheckpoint) {
  TempDir dir;
  constexpr int kRanks = 3;
  std::vector<std::unique_ptr<Checkpointer>> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.push_back(std::make_unique<Checkpointer>(
        dir.path().string(), CheckpointerOptions{.num_to_keep = 1, .job_instance = "fsdp-job"}));
  }
  for (int round = 0; round < 2; ++round) {
    const std::string name = ranks[0]->begin();  // rank 0 claims, then broadcasts the name
    std::vector<FileDigest> digests(kRanks);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) {
      threads.emplace_back([&, r] {
        digests[r] = ranks[r]->write_file(name, "shard_" + std::to_string(r) + ".pt",
                                          std::string(1000 + r, static_cast<char>('a' + r)));
      });
    }
    for (auto& t : threads) t.join();
    std::map<std::string, FileDigest> files;  // gathered on rank 0
    for (int r = 0; r < kRanks; ++r) files["shard_" + std::to_string(r) + ".pt"] = digests[r];
    ranks[0]->commit(name, 10 * round, files);
  }
  EXPECT_EQ(ranks[0]->list_complete(), std::vector<std::string>{"checkpoint_000001"});
  const auto loaded = ranks[2]->load_latest();
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->checkpoint.step, 10);
  ASSERT_EQ(loaded->checkpoint.files.size(), 3u);
  EXPECT_EQ(loaded->checkpoint.files.at("shard_2.pt"), std::string(1002, 'c'));
  const auto manifest =
      nlohmann::json::parse(*ranks[0]->storage().read(loaded->name + "/MANIFEST.json"));
  EXPECT_EQ(manifest["writer"]["job_instance"], "fsdp-job");
  EXPECT_EQ(manifest["writer"]["pid"], getpid());
}

TEST(Checkpointer, AReaderTakesNoLeaseAndCannotWrite) {
  TempDir dir;
  Checkpointer(dir.path().string(), {.job_instance = "job-a"}).save(make(1));
  Checkpointer writer(dir.path().string(), {.job_instance = "job-a"});
  Checkpointer reader(dir.path().string(), {.read_only = true, .job_instance = "job-b"});
  EXPECT_EQ(count_leases(reader.storage()), 1u);
  EXPECT_EQ(reader.load_latest()->checkpoint.step, 1);
  EXPECT_THROW(reader.save(make(2)), InvalidArgumentError);
  EXPECT_THROW(reader.begin(), InvalidArgumentError);
}

}  // namespace
}  // namespace trainyard::checkpoint
