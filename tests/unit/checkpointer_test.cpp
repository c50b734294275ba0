// Checkpointer and FileStorage: atomic saves with a manifest written last, SHA-256 verification
// on load, skipping corrupt or partial checkpoints, retention, and a save killed halfway.
#include "trainyard/checkpoint/checkpointer.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "trainyard/checkpoint/storage.h"
#include "trainyard/error.h"

namespace trainyard::checkpoint {
namespace {
namespace fs = std::filesystem;
using namespace std::chrono_literals;

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "trainyard_ckpt_XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

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

}  // namespace
}  // namespace trainyard::checkpoint
