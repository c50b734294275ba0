// S3 checkpoint storage against a real S3-compatible server: moto's (tests/multiproc/python/
// s3_server.py, from the venv scripts/setup.sh makes), started per test on 127.0.0.1 with port 0,
// checking every request's SigV4 signature; boto3 reads back what the storage writes. Also a
// scripted fake endpoint for retries and timeouts, and S3Config::from_uri's parsing and variables.
#include "trainyard/storage/s3_storage.h"
#include "../log_capture.h"
#include "trainyard/checkpoint/checkpointer.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "multiproc_util.h"
#include "trainyard/elastic/subprocess.h"
#include "trainyard/env.h"
#include "trainyard/error.h"
#include "trainyard/log.h"

namespace trainyard::checkpoint {
namespace {
using storage::make_s3_storage;
using storage::S3Config;

using namespace std::chrono_literals;
using elastic::UniqueFd;
using mptest::TempDir;
using Env = std::map<std::string, std::string>;

constexpr const char* kS3Server = TRAINYARD_SOURCE_DIR "/tests/multiproc/python/s3_server.py";
constexpr const char* kBucket = "trainyard-test";

EnvLookup env_of(Env vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// Bytes that differ from offset to offset, so a misplaced part shows.
std::string pattern(std::size_t size, unsigned seed) {
  std::string s(size, '\0');
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& c : s) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  return s;
}

// moto's S3 server holding kBucket, with one IAM user's key; stopped (SIGTERM) on destruction.
class S3Server {
 public:
  S3Server()
      : child_(elastic::SubprocessOptions{.argv = {TRAINYARD_PYTHON, kS3Server, kBucket},
                                          .stderr_mode = elastic::OutputMode::kInherit,
                                          .destructor_term_timeout = 2s}) {
    // It prints "listening on http://127.0.0.1:PORT KEY SECRET" once the bucket exists.
    const std::regex listening(R"(listening on (\S+) (\S+) (\S+)\n)");
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    std::string out;
    std::smatch m;
    while (!std::regex_search(out, m, listening)) {
      if (std::chrono::steady_clock::now() > deadline || !child_.running()) {
        throw std::runtime_error("moto's S3 server did not start within 30 s; its output: " + out);
      }
      pollfd p{.fd = child_.stdout_fd(), .events = POLLIN, .revents = 0};
      if (::poll(&p, 1, 50) == 1) {
        char buf[512];
        ssize_t n = ::read(p.fd, buf, sizeof(buf));
        if (n > 0) out.append(buf, static_cast<std::size_t>(n));
      }
    }
    endpoint_ = m[1].str();
    access_key_id_ = m[2].str();
    secret_access_key_ = m[3].str();
  }

  const std::string& endpoint() const { return endpoint_; }
  const std::string& access_key_id() const { return access_key_id_; }
  const std::string& secret_access_key() const { return secret_access_key_; }
  // An outage: SIGSTOP keeps its socket, so requests are accepted and never answered.
  void freeze() { child_.send_signal(SIGSTOP); }
  void thaw() { child_.send_signal(SIGCONT); }

  // The server's key, 5 MiB parts above 6 MiB, and fast retries.
  S3Config config(std::string prefix = "") const {
    return S3Config{.bucket = kBucket,
                    .prefix = std::move(prefix),
                    .endpoint = endpoint_,
                    .access_key_id = access_key_id_,
                    .secret_access_key = secret_access_key_,
                    .multipart_threshold = 6u << 20,
                    .part_size = 5u << 20,
                    .max_attempts = 2,
                    .initial_backoff = 10ms,
                    .connect_timeout = 2s,
                    .request_timeout = 10s};
  }

  // The variables an AWS SDK (and trainyard's S3 storage) reads to reach this server.
  std::vector<std::pair<std::string, std::string>> aws_env() const {
    return {{"AWS_ACCESS_KEY_ID", access_key_id_},
            {"AWS_SECRET_ACCESS_KEY", secret_access_key_},
            {"AWS_REGION", "us-east-1"},
            {"AWS_ENDPOINT_URL_S3", endpoint_}};
  }

 private:
  elastic::Subprocess child_;
  std::string endpoint_;
  std::string access_key_id_;
  std::string secret_access_key_;
};

class S3StorageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::system(TRAINYARD_PYTHON " -c 'import moto.server, boto3' >/dev/null 2>&1") != 0) {
      TY_MISSING_PREREQUISITE(TRAINYARD_PYTHON
                              " cannot import moto's server and boto3; run "
                              "scripts/setup.sh to install them.");
    }
    server_ = std::make_unique<S3Server>();
  }
  std::unique_ptr<S3Server> server_;
};

TEST_F(S3StorageTest, WritesAndReadsSmallAndEmptyObjects) {
  auto s = make_s3_storage(server_->config("runs/job 7"));
  EXPECT_EQ(s->uri(), "s3://trainyard-test/runs/job 7");
  s->write("checkpoint_000001/meta.json", R"({"step": 1})");
  s->write("checkpoint_000001/empty", "");
  EXPECT_EQ(s->read("checkpoint_000001/meta.json"), R"({"step": 1})");
  EXPECT_EQ(s->read("checkpoint_000001/empty"), "");
  s->write("checkpoint_000001/meta.json", "overwritten");
  EXPECT_EQ(s->read("checkpoint_000001/meta.json"), "overwritten");
  // The prefix is a real key prefix inside the bucket.
  auto root = make_s3_storage(server_->config());
  EXPECT_EQ(root->read("runs/job 7/checkpoint_000001/meta.json"), "overwritten");
}

TEST_F(S3StorageTest, MultipartUploadRoundTrips) {
  auto s = make_s3_storage(server_->config());
  const std::string big = pattern((11u << 20) + 12345, 1);  // 3 parts: 5 MiB, 5 MiB, the rest
  s->write("model.pt", big);
  const auto back = s->read("model.pt");
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->size(), big.size());
  EXPECT_TRUE(*back == big);
  EXPECT_EQ(s->list(""), std::vector<std::string>{"model.pt"});
}

TEST_F(S3StorageTest, MissingKeyReadsAsNulloptAndRemoveIsIdempotent) {
  auto s = make_s3_storage(server_->config("p"));
  EXPECT_EQ(s->read("nope"), std::nullopt);
  s->write("a", "1");
  s->write("b", "2");
  s->remove("a");
  s->remove("a");
  s->remove("never-written");
  EXPECT_EQ(s->read("a"), std::nullopt);
  EXPECT_EQ(s->list(""), std::vector<std::string>{"b"});
}

TEST_F(S3StorageTest, ListsByPrefixInOrderAcrossPages) {
  // 1,000 keys is S3's page, so 1,005 keys need a continuation token; written from 4 threads,
  // which also exercises the storage's thread safety.
  auto s = make_s3_storage(server_->config("job"));
  std::vector<std::string> expected;
  for (int i = 0; i < 1005; ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "ckpt/%04d", (i * 7919) % 1005);
    expected.emplace_back(name);
  }
  std::vector<std::thread> writers;
  for (int t = 0; t < 4; ++t) {
    writers.emplace_back([&, t] {
      for (std::size_t i = t; i < expected.size(); i += 4) s->write(expected[i], "x");
    });
  }
  for (auto& w : writers) w.join();
  s->write("ckpt_other", "y");
  s->write("zzz/ckpt/0001", "z");
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(s->list("ckpt/"), expected);
  EXPECT_EQ(s->list("ckpt").size(), expected.size() + 1);
  EXPECT_EQ(s->list("").size(), expected.size() + 2);
  EXPECT_EQ(s->list("ckpt/100"), (std::vector<std::string>{"ckpt/1000", "ckpt/1001", "ckpt/1002",
                                                           "ckpt/1003", "ckpt/1004"}));
  EXPECT_TRUE(s->list("nothing/").empty());
}

TEST_F(S3StorageTest, KeysWithSpacesAndSpecialCharacters) {
  auto s = make_s3_storage(server_->config("weird prefix+&"));
  const std::vector<std::string> keys = {
      "a b/c d.pt",    "plus+equals=amp&", "q?hash#pct%25",
      "quote'\"<tag>", "t~i!l*d(e)$,;:@",  "unicode/é ü 日本",
  };
  for (std::size_t i = 0; i < keys.size(); ++i) s->write(keys[i], "value " + std::to_string(i));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(s->read(keys[i]), "value " + std::to_string(i)) << keys[i];
  }
  auto sorted = keys;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(s->list(""), sorted);
  EXPECT_EQ(s->list("a b/"), std::vector<std::string>{"a b/c d.pt"});
  EXPECT_EQ(s->list("quote'\"<"), std::vector<std::string>{"quote'\"<tag>"});
  s->remove("plus+equals=amp&");
  EXPECT_EQ(s->read("plus+equals=amp&"), std::nullopt);
}

// The error a PUT with `config`'s credentials gets: not a network error (nothing to retry), and
// naming the request; empty when the write succeeded.
std::string rejected_write_error(const S3Config& config) {
  try {
    make_s3_storage(config)->write("k", "v");
  } catch (const NetworkError& e) {
    ADD_FAILURE() << "rejected credentials are not a network error: " << e.what();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("PUT s3://trainyard-test/k"), std::string::npos) << msg;
    return msg;
  }
  return "";
}

TEST_F(S3StorageTest, WrongAccessKeyIsAClearError) {
  auto config = server_->config();
  config.access_key_id = "NOT-A-KEY";
  const std::string msg = rejected_write_error(config);
  EXPECT_NE(msg.find("HTTP 403 InvalidAccessKeyId"), std::string::npos) << msg;
  EXPECT_NE(msg.find("HINT: check AWS_ACCESS_KEY_ID"), std::string::npos) << msg;
}

TEST_F(S3StorageTest, WrongSecretKeyIsRejectedByTheSignatureCheck) {
  // The server recomputes every SigV4 signature with the key's real secret.
  auto config = server_->config();
  config.secret_access_key = "not-the-secret";
  const std::string msg = rejected_write_error(config);
  EXPECT_NE(msg.find("HTTP 403 SignatureDoesNotMatch"), std::string::npos) << msg;
  EXPECT_NE(msg.find("AWS_SECRET_ACCESS_KEY"), std::string::npos) << msg;
}

// boto3 (tests/multiproc/python/s3_boto3.py) on the other side: what the storage writes, AWS's SDK
// lists and reads back byte for byte, and what the SDK uploads (multipart too), the storage reads.
TEST_F(S3StorageTest, Boto3ReadsWhatTheStorageWritesAndTheReverse) {
  const std::map<std::string, std::string> objects = {
      {"ckpt/meta.json", R"({"step": 1})"},
      {"ckpt/empty", ""},
      {"ckpt/model.pt", pattern((11u << 20) + 777, 2)},  // multipart: 5 + 5 MiB + the rest
      {"ckpt/a b+c=d&e/f\xc3\xa9.bin", pattern(4097, 3)}};
  const std::string script = TRAINYARD_SOURCE_DIR "/tests/multiproc/python/s3_boto3.py";
  auto boto3 = [&](const std::string& mode, const std::string& prefix, const TempDir& dir) {
    auto r = mptest::run_program({TRAINYARD_PYTHON, script, mode, kBucket, prefix, dir.str()},
                                 server_->aws_env(), 60s);
    EXPECT_TRUE(r.status.success()) << r.out << r.err;
    return r.out;
  };

  auto ours = make_s3_storage(server_->config("written-by-trainyard"));
  for (const auto& [key, bytes] : objects) ours->write(key, bytes);
  TempDir downloads;
  const auto listed = nlohmann::json::parse(boto3("get", "written-by-trainyard/", downloads));
  std::vector<std::string> expected_keys;
  for (const auto& [key, bytes] : objects) expected_keys.push_back("written-by-trainyard/" + key);
  ASSERT_EQ(listed.get<std::vector<std::string>>(), expected_keys);
  std::size_t n = 0;
  for (const auto& [key, bytes] : objects) {
    const std::string back = mptest::read_file(downloads.path() / std::to_string(n++));
    EXPECT_EQ(back.size(), bytes.size()) << key;
    EXPECT_TRUE(back == bytes) << key << " differs as boto3 reads it";
  }

  TempDir uploads;
  nlohmann::json manifest;
  n = 0;
  for (const auto& [key, bytes] : objects) {
    const std::string name = std::to_string(n++);
    std::ofstream(uploads.path() / name, std::ios::binary) << bytes;
    manifest[key] = name;
  }
  std::ofstream(uploads.path() / "manifest.json") << manifest.dump();
  boto3("put", "written-by-boto3/", uploads);
  auto theirs = make_s3_storage(server_->config("written-by-boto3"));
  std::vector<std::string> keys;
  for (const auto& [key, bytes] : objects) keys.push_back(key);
  EXPECT_EQ(theirs->list(""), keys);
  for (const auto& [key, bytes] : objects) {
    const auto back = theirs->read(key);
    ASSERT_TRUE(back.has_value()) << key;
    EXPECT_TRUE(*back == bytes) << key << " differs as the storage reads it";
  }
}

TEST_F(S3StorageTest, MissingBucketIsAnErrorNotAMissingKey) {
  auto config = server_->config();
  config.bucket = "no-such-bucket";
  auto s = make_s3_storage(config);
  for (const auto& op :
       std::vector<std::function<void()>>{[&] { s->read("k"); }, [&] { s->write("k", "v"); },
                                          [&] { s->list(""); }, [&] { s->remove("k"); }}) {
    try {
      op();
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("s3://no-such-bucket"), std::string::npos) << msg;
      EXPECT_NE(msg.find("HTTP 404 NoSuchBucket"), std::string::npos) << msg;
      EXPECT_NE(msg.find("HINT: create bucket 'no-such-bucket'"), std::string::npos) << msg;
    }
  }
}

TEST_F(S3StorageTest, OpensFromUriAndEnvironment) {
  auto config = S3Config::from_uri("s3://trainyard-test/runs/job7/",
                                   env_of({{"AWS_ACCESS_KEY_ID", server_->access_key_id()},
                                           {"AWS_SECRET_ACCESS_KEY", server_->secret_access_key()},
                                           {"AWS_ENDPOINT_URL_S3", server_->endpoint() + "/"}}));
  auto s = make_s3_storage(config);
  EXPECT_EQ(s->uri(), "s3://trainyard-test/runs/job7");
  s->write("x", "from the environment");
  EXPECT_EQ(make_s3_storage(server_->config())->read("runs/job7/x"), "from the environment");
}

// A scripted HTTP endpoint on 127.0.0.1: the n-th request (counting from 0) gets
// responses[min(n, size - 1)], one request per connection. Records each request line.
class FakeEndpoint {
 public:
  explicit FakeEndpoint(std::vector<std::string> responses)
      : listener_(mptest::bind_loopback(/*listen=*/true, &port_)),
        responses_(std::move(responses)) {
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeEndpoint() {
    stop_ = true;
    thread_.join();
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // "GET /b/k HTTP/1.1", ... for the requests answered so far.
  std::vector<std::string> requests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

  static std::string response(int status,
                              const std::string& body,
                              const std::string& extra_headers = "") {
    return "HTTP/1.1 " + std::to_string(status) + " X\r\nContent-Type: application/xml\r\n" +
           "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n" +
           extra_headers + "\r\n" + body;
  }

 private:
  void serve() {
    while (!stop_) {
      pollfd p{.fd = listener_.get(), .events = POLLIN, .revents = 0};
      if (::poll(&p, 1, 20) != 1) continue;
      UniqueFd conn(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!conn.valid()) continue;
      // Read the head and the Content-Length body (the tests send small ones): closing with
      // unread bytes would reset the connection under the client.
      std::string request;
      std::size_t need = std::string::npos;
      char buf[4096];
      while (request.size() < need) {
        pollfd c{.fd = conn.get(), .events = POLLIN, .revents = 0};
        if (::poll(&c, 1, 2000) != 1) break;
        ssize_t n = ::read(conn.get(), buf, sizeof(buf));
        if (n <= 0) break;
        request.append(buf, static_cast<std::size_t>(n));
        const std::size_t head_end = request.find("\r\n\r\n");
        if (need == std::string::npos && head_end != std::string::npos) {
          std::smatch m;
          const std::string head = request.substr(0, head_end);
          static const std::regex length(R"(\r\ncontent-length:\s*(\d+))", std::regex::icase);
          need = head_end + 4 + (std::regex_search(head, m, length) ? std::stoul(m[1]) : 0);
        }
      }
      std::size_t n = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        requests_.push_back(request.substr(0, request.find("\r\n")));
        n = requests_.size() - 1;
      }
      const std::string& out = responses_[std::min(n, responses_.size() - 1)];
      if (::write(conn.get(), out.data(), out.size()) < 0) continue;
    }
  }

  int port_ = 0;
  UniqueFd listener_;
  std::vector<std::string> responses_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::vector<std::string> requests_;  // guarded by mu_
  std::thread thread_;
};

S3Config fake_config(const std::string& endpoint) {
  return S3Config{.bucket = "b",
                  .endpoint = endpoint,
                  .access_key_id = "key",
                  .secret_access_key = "secret",
                  .max_attempts = 3,
                  .initial_backoff = 10ms,
                  .connect_timeout = 500ms,
                  .request_timeout = 500ms};
}

const std::string kSlowDown = FakeEndpoint::response(
    503, "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>");

TEST_F(S3StorageTest, CheckpointerOnS3SkipsCorruptAndPartialAndKeepsNumToKeep) {
  checkpoint::Checkpointer c(make_s3_storage(server_->config("runs/ckpt")), {.num_to_keep = 2});
  auto make = [](std::int64_t step) {
    checkpoint::Checkpoint k{.step = step};
    k.files["model.pt"] = std::string(7u << 20, static_cast<char>('a' + step));  // multipart
    k.files["state.json"] = "{}";
    return k;
  };
  for (int step = 1; step <= 3; ++step) c.save(make(step));
  EXPECT_EQ(c.list_complete(),
            (std::vector<std::string>{"checkpoint_000001", "checkpoint_000002"}));
  // Corrupt the newest: the load falls back to the one before it.
  c.storage().write("checkpoint_000002/model.pt", "garbage");
  auto latest = c.load_latest();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->name, "checkpoint_000001");
  EXPECT_EQ(latest->checkpoint.step, 2);
  EXPECT_EQ(latest->checkpoint.files.at("model.pt"), make(2).files.at("model.pt"));
  // A save that died before its manifest is never picked, and the next save removes it.
  c.storage().write("checkpoint_000003/model.pt", "half");
  EXPECT_EQ(c.load_latest()->name, "checkpoint_000001");
  EXPECT_EQ(c.save(make(4)), "checkpoint_000004");
  EXPECT_TRUE(c.storage().list("checkpoint_000003/").empty());
  EXPECT_EQ(c.load_latest()->checkpoint.step, 4);
}

// Ranged reads on S3 and on a file system give the same bytes; download() copies an object in
// pieces into a local file.
TEST_F(S3StorageTest, ReadsByteRangesAndDownloadsInPieces) {
  TempDir local;
  std::string data;
  for (int i = 0; i < 1000; ++i) data += static_cast<char>('a' + i % 26);
  auto s3 = make_s3_storage(server_->config("ranges"));
  auto file = storage::open_storage(local.str());
  for (auto* s : {s3.get(), file.get()}) {
    SCOPED_TRACE(s->uri());
    s->write("blob", data);
    EXPECT_EQ(s->read_range("blob", 10, 20), data.substr(10, 20));
    EXPECT_EQ(s->read_range("blob", 990, 100), data.substr(990)) << "fewer bytes at the end";
    EXPECT_EQ(s->read_range("blob", 1000, 5), "") << "none from the end on";
    EXPECT_EQ(s->read_range("blob", 5, 0), "");
    EXPECT_EQ(s->read_range("missing", 0, 5), std::nullopt);
    const auto copy = (local.path() / "copies" / "blob").string();
    std::filesystem::remove(copy);
    storage::download(*s, "blob", copy, /*piece_bytes=*/64);
    EXPECT_EQ(mptest::read_file(copy), data);
    EXPECT_THROW(storage::download(*s, "missing", copy + ".2", 64), Error);
    EXPECT_FALSE(std::filesystem::exists(copy + ".2"));
  }
}

// A Hugging Face folder on S3 is fetched into the local cache and generates what the same folder
// does locally.
TEST_F(S3StorageTest, GenerateReadsAModelFolderFromS3) {
  TempDir dir;
  const auto cmd = std::string(TRAINYARD_PYTHON " ") + TRAINYARD_SOURCE_DIR +
                   "/tests/unit/python/gpt_neox_reference.py " + dir.str() + " f32";
  if (std::system(TRAINYARD_PYTHON " -c 'import torch' >/dev/null 2>&1") != 0)
    TY_MISSING_PREREQUISITE(TRAINYARD_PYTHON " has no torch (scripts/setup.sh installs it)");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto bucket = make_s3_storage(server_->config("models/tiny"));
  for (const char* f : {"config.json", "model.safetensors"})
    bucket->write(f, mptest::read_file(dir.path() / "safetensors" / f));
  auto env = server_->aws_env();
  env.emplace_back("XDG_CACHE_HOME", dir.str() + "/cache");
  auto generate = [&](const std::string& model) {
    auto r = mptest::run_program({TRAINYARD_CLI_PATH, "generate", "--model", model, "--prompt-ids",
                                  "3,1,4,1,5", "--greedy", "--max-new-tokens", "6", "--print-ids"},
                                 env, 60s);
    EXPECT_TRUE(r.status.success()) << r.out << r.err;
    return r.out;
  };
  const auto remote = generate(std::string("s3://") + kBucket + "/models/tiny");
  EXPECT_EQ(remote, generate((dir.path() / "safetensors").string()));
  EXPECT_EQ(std::count(remote.begin(), remote.end(), ','), 5) << remote;
  std::size_t cached = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path() / "cache"))
    cached += e.path().filename() == "model.safetensors";
  EXPECT_EQ(cached, 1u) << "the folder's weights were fetched into the cache";
}

TEST_F(S3StorageTest, RecipeCheckpointsToS3AndResumesFromThere) {
  // The recipe through the CLI with --storage s3://...: results and checkpoints land in the
  // bucket, and running again with more epochs resumes from the checkpoint there.
  const auto env = server_->aws_env();
  std::vector<std::string> argv = {TRAINYARD_CLI_PATH,
                                   "train",
                                   "fashion-mnist",
                                   "--workers",
                                   "1",
                                   "--epochs",
                                   "1",
                                   "--limit",
                                   "256",
                                   "--batch-size",
                                   "64",
                                   "--checkpoint-every",
                                   "2",
                                   "--storage",
                                   std::string("s3://") + kBucket + "/runs",
                                   "--name",
                                   "s3job",
                                   "--no-progress"};
  auto first = mptest::run_program(argv, env, 90s);
  ASSERT_TRUE(first.status.success()) << first.out << first.err;
  argv[6] = "2";  // --epochs 2
  auto second = mptest::run_program(argv, env, 90s);
  ASSERT_TRUE(second.status.success()) << second.out << second.err;
  EXPECT_NE(second.out.find("Resuming from checkpoint_000001 at step 4"), std::string::npos)
      << second.out;
  auto s = make_s3_storage(server_->config("runs/s3job"));
  const auto result = s->read("result.json");
  ASSERT_TRUE(result.has_value());
  EXPECT_NE(result->find("\"global_step\": 8"), std::string::npos) << *result;
  EXPECT_FALSE(s->list("checkpoint_000003/").empty());
}

TEST(S3StorageRetry, RetriesSlowDownAndServerErrors) {
  FakeEndpoint fake({kSlowDown,
                     FakeEndpoint::response(500,
                                            "<Error><Code>InternalError</Code>"
                                            "</Error>"),
                     FakeEndpoint::response(200, "payload")});
  auto s = make_s3_storage(fake_config(fake.endpoint()));
  EXPECT_EQ(s->read("k"), "payload");
  EXPECT_EQ(fake.requests().size(), 3u);
}

TEST(S3StorageRetry, GivesUpAfterMaxAttemptsNamingEachFailure) {
  FakeEndpoint fake({kSlowDown});
  auto s = make_s3_storage(fake_config(fake.endpoint()));
  try {
    s->read("ckpt/k");
    FAIL() << "expected a NetworkError";
  } catch (const NetworkError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("GET s3://b/ckpt/k failed after 3 attempt(s)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Attempts 1-3: HTTP 503 SlowDown: Please reduce your request rate."),
              std::string::npos)
        << msg;
  }
  EXPECT_EQ(fake.requests().size(), 3u);
}

TEST(S3StorageRetry, DoesNotRetryClientErrors) {
  FakeEndpoint fake({FakeEndpoint::response(
      403, "<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>")});
  auto s = make_s3_storage(fake_config(fake.endpoint()));
  EXPECT_THROW(s->read("k"), Error);
  EXPECT_EQ(fake.requests().size(), 1u);
}

const std::string kInitiated =
    FakeEndpoint::response(200,
                           "<InitiateMultipartUploadResult><UploadId>up/1+&amp;</UploadId>"
                           "</InitiateMultipartUploadResult>");
const std::string kPartDone = FakeEndpoint::response(200, "", "ETag: \"e1\"\r\n");

TEST(S3StorageRetry, FailedMultipartUploadIsAborted) {
  FakeEndpoint fake(
      {kInitiated,
       FakeEndpoint::response(403, "<Error><Code>AccessDenied</Code><Message>no</Message></Error>"),
       FakeEndpoint::response(204, "")});
  auto config = fake_config(fake.endpoint());
  config.multipart_threshold = 4;
  EXPECT_THROW(make_s3_storage(config)->write("big", "0123456789"), Error);
  EXPECT_EQ(fake.requests(), (std::vector<std::string>{
                                 "POST /b/big?uploads= HTTP/1.1",
                                 "PUT /b/big?partNumber=1&uploadId=up%2F1%2B%26 HTTP/1.1",
                                 "DELETE /b/big?uploadId=up%2F1%2B%26 HTTP/1.1",
                             }));
}

TEST(S3StorageRetry, RetriesAnErrorInsideA200CompleteAnswer) {
  // CompleteMultipartUpload can fail after S3 has sent "200 OK": the error is in the body.
  FakeEndpoint fake(
      {kInitiated, kPartDone,
       FakeEndpoint::response(200, "<Error><Code>InternalError</Code><Message>x</Message></Error>"),
       FakeEndpoint::response(200, "<CompleteMultipartUploadResult/>")});
  auto config = fake_config(fake.endpoint());
  config.multipart_threshold = 4;
  make_s3_storage(config)->write("big", "0123456789");
  const auto requests = fake.requests();
  ASSERT_EQ(requests.size(), 4u);
  EXPECT_EQ(requests[2], "POST /b/big?uploadId=up%2F1%2B%26 HTTP/1.1");
  EXPECT_EQ(requests[3], requests[2]);
}

TEST(S3StorageRetry, UnreachableEndpointIsANetworkError) {
  int port = 0;
  {
    UniqueFd closed = mptest::bind_loopback(/*listen=*/true, &port);
  }  // a port with nothing listening
  auto s = make_s3_storage(fake_config("http://127.0.0.1:" + std::to_string(port)));
  const auto start = std::chrono::steady_clock::now();
  try {
    s->write("k", "v");
    FAIL() << "expected a NetworkError";
  } catch (const NetworkError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("PUT s3://b/k failed after 3 attempt(s) against http://127.0.0.1:" +
                       std::to_string(port)),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find(": curl error 7"), std::string::npos) << msg;
    EXPECT_NE(msg.find("HINT: is the endpoint"), std::string::npos) << msg;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

TEST(S3StorageRetry, SilentEndpointTimesOut) {
  int port = 0;
  UniqueFd silent =
      mptest::bind_loopback(/*listen=*/true, &port);  // connects (the backlog) but never answers
  auto config = fake_config("http://127.0.0.1:" + std::to_string(port));
  config.max_attempts = 2;
  config.request_timeout = 300ms;
  auto s = make_s3_storage(config);
  const auto start = std::chrono::steady_clock::now();
  try {
    s->list("");
    FAIL() << "expected a NetworkError";
  } catch (const NetworkError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("failed after 2 attempt(s)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("timed out"), std::string::npos) << msg;
    EXPECT_NE(msg.find("request_timeout"), std::string::npos) << msg;
  }
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_GE(elapsed, 600ms);
  EXPECT_LT(elapsed, 2s);
}

using trainyard::test::LogCapture;

TEST(S3StorageRetry, FrozenEndpointIsAbandonedWithinTheDeadlineWithWarnings) {
  int port = 0;
  // Connections complete (the listen backlog), but nothing is ever read or answered.
  UniqueFd frozen = mptest::bind_loopback(/*listen=*/true, &port);
  auto config = fake_config("http://127.0.0.1:" + std::to_string(port));
  config.max_attempts = 0;  // only the deadline ends the retries
  config.retry_deadline = 3s;
  config.stall_timeout = 2s;
  config.request_timeout = 300s;  // the old default: the stall timeout must end attempts first
  config.initial_backoff = 100ms;
  config.warn_every = 1s;
  auto s = make_s3_storage(config);
  LogCapture log("s3");
  const auto start = std::chrono::steady_clock::now();
  try {
    s->read("ckpt/model.pt");
    FAIL() << "expected a NetworkError";
  } catch (const NetworkError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("GET s3://b/ckpt/model.pt failed after "), std::string::npos) << msg;
    EXPECT_NE(msg.find("S3Config.retry_deadline = 3 s"), std::string::npos) << msg;
    EXPECT_NE(msg.find("curl error 28"), std::string::npos) << msg;
    EXPECT_NE(msg.find("stall_timeout"), std::string::npos) << msg;
  }
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_GE(elapsed, 3s) << "it retries until the deadline";
  EXPECT_LT(elapsed, 60s) << "bounded by the deadline plus one stalled attempt (and a slow box)";
  const std::string text = log.text();
  EXPECT_NE(text.find("Still waiting for http://127.0.0.1:" + std::to_string(port) +
                      " to answer GET s3://b/ckpt/model.pt (attempt 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("failed at attempt 1"), std::string::npos) << text;
}

TEST(S3StorageRetry, AShortOutageIsRiddenOut) {
  // Six 503s in a row (about 3 to 6 s of backoff), then the answer.
  std::vector<std::string> responses(6, kSlowDown);
  responses.push_back(FakeEndpoint::response(200, "payload"));
  FakeEndpoint fake(responses);
  auto config = fake_config(fake.endpoint());
  config.max_attempts = 0;
  config.retry_deadline = 60s;
  config.initial_backoff = 100ms;
  auto s = make_s3_storage(config);
  EXPECT_EQ(s->read("k"), "payload");
  EXPECT_EQ(fake.requests().size(), 7u);
}

TEST_F(S3StorageTest, ACheckpointSavedWhileTheRealServerIsFrozenIsWrittenOnceItThaws) {
  // The outage: 4 s of a frozen S3 server. Each stalled attempt is abandoned after 2 s and retried
  // until the deadline, which the outage stays well within.
  auto config = server_->config("runs/outage");
  config.max_attempts = 0;
  config.retry_deadline = 60s;
  config.stall_timeout = 2s;
  Checkpointer c(make_s3_storage(config), {.job_instance = "outage"});
  c.save(Checkpoint{.step = 1, .files = {{"model.pt", pattern(1 << 20, 1)}}});
  server_->freeze();
  std::thread outage([&] {
    std::this_thread::sleep_for(4s);
    server_->thaw();
  });
  const auto start = std::chrono::steady_clock::now();
  std::string saved;
  EXPECT_NO_THROW(saved =
                      c.save(Checkpoint{.step = 2, .files = {{"model.pt", pattern(1 << 20, 2)}}}));
  outage.join();
  EXPECT_GE(std::chrono::steady_clock::now() - start, 3s) << "the save did not wait out the outage";
  const auto latest = c.load_latest();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->name, saved);
  EXPECT_EQ(latest->checkpoint.files.at("model.pt"), pattern(1 << 20, 2));
}

TEST_F(S3StorageTest, CheckpointerOnS3OwnsItsRunAndClaimsNumbersAtomically) {
  Checkpointer a(make_s3_storage(server_->config("runs/owned")),
                 {.num_to_keep = 2, .job_instance = "job-a"});
  a.save(Checkpoint{.step = 1, .files = {{"model.pt", "one"}}});
  try {
    Checkpointer b(make_s3_storage(server_->config("runs/owned")), {.job_instance = "job-b"});
    FAIL() << "a second job must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pid " + std::to_string(getpid())), std::string::npos)
        << e.what();
  }
  // Writers of one job racing for numbers.
  Checkpointer sibling(make_s3_storage(server_->config("runs/owned")), {.job_instance = "job-a"});
  std::vector<std::string> from_a, from_sibling;
  std::thread t([&] {
    for (int i = 0; i < 4; ++i) from_sibling.push_back(sibling.begin());
  });
  for (int i = 0; i < 4; ++i) from_a.push_back(a.begin());
  t.join();
  std::vector<std::string> all = from_a;
  all.insert(all.end(), from_sibling.begin(), from_sibling.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::unique(all.begin(), all.end()), all.end()) << "a number was handed out twice";
  // The sibling's claims are a live writer's saves in progress: a's retention leaves them.
  const auto name = a.save(Checkpoint{.step = 2, .files = {{"model.pt", "two"}}});
  for (const auto& n : from_sibling) {
    if (n < name) {
      EXPECT_FALSE(a.storage().list(n + "/").empty()) << n;
    }
  }
  EXPECT_EQ(a.load_latest()->checkpoint.step, 2);
}

TEST(S3Config, ParsesUriAndEnvironment) {
  const Env creds = {{"AWS_ACCESS_KEY_ID", "AKIA"}, {"AWS_SECRET_ACCESS_KEY", "secret"}};
  auto c = S3Config::from_uri("s3://bucket/runs/job7/", env_of(creds));
  EXPECT_EQ(c.bucket, "bucket");
  EXPECT_EQ(c.prefix, "runs/job7");
  EXPECT_EQ(c.access_key_id, "AKIA");
  EXPECT_EQ(c.secret_access_key, "secret");
  EXPECT_EQ(c.session_token, "");
  EXPECT_EQ(c.region, "us-east-1");
  EXPECT_EQ(c.endpoint, "");
  EXPECT_EQ(S3Config::from_uri("s3://bucket", env_of(creds)).prefix, "");
  EXPECT_EQ(S3Config::from_uri("s3://bucket/", env_of(creds)).prefix, "");

  Env all = creds;
  all.insert({{"AWS_SESSION_TOKEN", "tok"},
              {"AWS_REGION", "eu-west-1"},
              {"AWS_DEFAULT_REGION", "us-west-2"},
              {"AWS_ENDPOINT_URL_S3", "http://s3.local:9000"},
              {"AWS_ENDPOINT_URL", "http://other:1"}});
  c = S3Config::from_uri("s3://bucket/p", env_of(all));
  EXPECT_EQ(c.session_token, "tok");
  EXPECT_EQ(c.region, "eu-west-1");
  EXPECT_EQ(c.endpoint, "http://s3.local:9000");

  all.erase("AWS_REGION");
  all.erase("AWS_ENDPOINT_URL_S3");
  c = S3Config::from_uri("s3://bucket/p", env_of(all));
  EXPECT_EQ(c.region, "us-west-2");
  EXPECT_EQ(c.endpoint, "http://other:1");
  EXPECT_EQ(c.retry_deadline, 60s);

  all[kS3RetryDeadlineEnv] = "7";
  EXPECT_EQ(S3Config::from_uri("s3://bucket/p", env_of(all)).retry_deadline, 7s);
  all[kS3RetryDeadlineEnv] = "soon";
  EXPECT_THROW(S3Config::from_uri("s3://bucket/p", env_of(all)), InvalidArgumentError);
}

void expect_invalid(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected InvalidArgumentError mentioning '" << needle << "'";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(S3Config, RejectsBadUrisAndMissingCredentials) {
  const auto creds = env_of({{"AWS_ACCESS_KEY_ID", "AKIA"}, {"AWS_SECRET_ACCESS_KEY", "s"}});
  expect_invalid([&] { S3Config::from_uri("s3://", creds); }, "names no bucket");
  expect_invalid([&] { S3Config::from_uri("s3:///prefix", creds); }, "names no bucket");
  expect_invalid([&] { S3Config::from_uri("gs://bucket/p", creds); }, "is not an S3 URI");
  expect_invalid([&] { S3Config::from_uri("bucket/p", creds); }, "is not an S3 URI");
  // No credentials anywhere (instance metadata off: a test reaches no address but loopback).
  expect_invalid(
      [&] {
        S3Config::from_uri("s3://b/p",
                           env_of({{"HOME", "/nonexistent"}, {"AWS_EC2_METADATA_DISABLED", "true"}}));
      },
      "AWS_ACCESS_KEY_ID");
  expect_invalid(
      [&] {
        S3Config::from_uri("s3://b/p", env_of({{"AWS_ACCESS_KEY_ID", "AKIA"}}));
      },
      "AWS_SECRET_ACCESS_KEY is not set");
  expect_invalid(
      [&] {
        S3Config::from_uri("s3://b/p",
                           env_of({{"AWS_ACCESS_KEY_ID", ""}, {"AWS_SECRET_ACCESS_KEY", "s"}}));
      },
      "AWS_ACCESS_KEY_ID is not set");
}

TEST(S3Config, MakeValidatesFields) {
  const S3Config good{.bucket = "b", .access_key_id = "k", .secret_access_key = "s"};
  EXPECT_EQ(make_s3_storage(good)->uri(), "s3://b");
  auto with = [&](auto change) {
    S3Config c = good;
    change(c);
    return [c] { make_s3_storage(c); };
  };
  expect_invalid(with([](S3Config& c) { c.part_size = 1u << 20; }), "S3Config.part_size");
  expect_invalid(with([](S3Config& c) { c.endpoint = "localhost:9000"; }), "S3Config.endpoint");
  expect_invalid(with([](S3Config& c) { c.prefix = "/runs"; }), "S3Config.prefix");
  expect_invalid(with([](S3Config& c) { c.bucket = "a/b"; }), "S3Config.bucket");
  expect_invalid(with([](S3Config& c) { c.max_attempts = -1; }), "S3Config.max_attempts");
  expect_invalid(with([](S3Config& c) { c.stall_timeout = 0s; }), "stall_timeout = 0 s");
  expect_invalid(with([](S3Config& c) { c.secret_access_key = ""; }), "AWS_SECRET_ACCESS_KEY");
  expect_invalid([&] { make_s3_storage(good)->read(""); }, "non-empty relative path");
}

}  // namespace
}  // namespace trainyard::checkpoint
