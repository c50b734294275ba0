// Data: the IDX reader on good and damaged files, the DistributedSampler's contract, the loader.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "../temp_dir.h"
#include "trainyard/data/batch_loader.h"
#include "trainyard/data/distributed_sampler.h"
#include "trainyard/data/fashion_mnist.h"
#include "trainyard/data/idx.h"
#include "trainyard/error.h"

namespace {
namespace fs = std::filesystem;
using namespace trainyard::data;

// The shared TempDir that also names files in itself.
class TempDir : public trainyard::test::TempDir {
 public:
  TempDir() : trainyard::test::TempDir("trainyard_data_test") {}
  std::string file(const std::string& name) const { return (path() / name).string(); }
};

std::vector<uint8_t> idx_bytes(uint8_t type, std::vector<uint32_t> dims, size_t payload) {
  std::vector<uint8_t> out = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (auto d : dims) {
    out.push_back(d >> 24);
    out.push_back((d >> 16) & 0xff);
    out.push_back((d >> 8) & 0xff);
    out.push_back(d & 0xff);
  }
  for (size_t i = 0; i < payload; ++i) out.push_back(static_cast<uint8_t>(i * 7));
  return out;
}

void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), bytes.size()), static_cast<int>(bytes.size()));
  gzclose(f);
}

TEST(Idx, ReadsAGoodFile) {
  TempDir dir;
  write_gz(dir.file("a.gz"), idx_bytes(0x08, {3, 2, 4}, 24));
  auto t = read_idx_ubyte(dir.file("a.gz"), 3);
  EXPECT_EQ(t.sizes(), torch::IntArrayRef({3, 2, 4}));
  EXPECT_EQ(t[2][1][3].item<int>(), (23 * 7) & 0xff);
}

TEST(Idx, RejectsWrongMagic) {
  TempDir dir;
  auto bytes = idx_bytes(0x08, {3}, 3);
  bytes[0] = 0x1f;
  write_gz(dir.file("b.gz"), bytes);
  try {
    read_idx_ubyte(dir.file("b.gz"), 1);
    FAIL() << "expected CorruptDataError";
  } catch (const trainyard::CorruptDataError& e) {
    EXPECT_NE(std::string(e.what()).find("wrong magic"), std::string::npos) << e.what();
  }
}

TEST(Idx, RejectsWrongDimensionsAndType) {
  TempDir dir;
  write_gz(dir.file("c.gz"), idx_bytes(0x08, {3, 2}, 6));
  EXPECT_THROW(read_idx_ubyte(dir.file("c.gz"), 3), trainyard::CorruptDataError);
  write_gz(dir.file("d.gz"), idx_bytes(0x0D, {3}, 12));
  EXPECT_THROW(read_idx_ubyte(dir.file("d.gz"), 1), trainyard::CorruptDataError);
}

TEST(Idx, RejectsTruncatedFile) {
  TempDir dir;
  write_gz(dir.file("e.gz"), idx_bytes(0x08, {10, 28, 28}, 10 * 28 * 28 - 100));
  try {
    read_idx_ubyte(dir.file("e.gz"), 3);
    FAIL() << "expected CorruptDataError";
  } catch (const trainyard::CorruptDataError& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("7840"), std::string::npos) << e.what();
  }
  // A gzip stream cut in the middle is damaged too.
  write_gz(dir.file("f.gz"), idx_bytes(0x08, {1000}, 1000));
  fs::resize_file(dir.file("f.gz"), fs::file_size(dir.file("f.gz")) / 2);
  EXPECT_THROW(read_idx_ubyte(dir.file("f.gz"), 1), trainyard::CorruptDataError);
}

TEST(Idx, NamesAMissingFileAndThePackage) {
  try {
    read_idx_ubyte("/nonexistent/train-images-idx3-ubyte.gz", 3);
    FAIL() << "expected Error";
  } catch (const trainyard::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/train-images-idx3-ubyte.gz"),
              std::string::npos);
    EXPECT_NE(std::string(e.what()).find("dataset-fashion-mnist"), std::string::npos);
  }
}

TEST(FashionMnist, LoadsTheDebianPackage) {
  auto test = load_fashion_mnist(kFashionMnistDir, Split::kTest);
  EXPECT_EQ(test.size(), 10000);
  EXPECT_EQ(test.images.sizes(), torch::IntArrayRef({10000, 28, 28}));
  EXPECT_EQ(test.labels.bincount().min().item<int64_t>(), 1000);  // 1,000 per class
  auto train = load_fashion_mnist(kFashionMnistDir, Split::kTrain, 600);
  EXPECT_EQ(train.size(), 600);
  auto [x, y] = fashion_mnist_batch(train, {0, 5, 9});
  EXPECT_EQ(x.sizes(), torch::IntArrayRef({3, 1, 28, 28}));
  EXPECT_GE(x.min().item<float>(), -1.0f);
  EXPECT_LE(x.max().item<float>(), 1.0f);
  EXPECT_EQ(y[1].item<int64_t>(), train.labels[5].item<int64_t>());
}

struct SamplerCase {
  int64_t n;
  int replicas;
  bool drop_last;
};
class Sampler : public ::testing::TestWithParam<SamplerCase> {};

TEST_P(Sampler, DisjointCompleteAndDeterministic) {
  const auto c = GetParam();
  std::multiset<int64_t> seen;
  std::vector<std::vector<int64_t>> per_rank;
  for (int r = 0; r < c.replicas; ++r) {
    DistributedSampler s({.dataset_size = c.n,
                          .num_replicas = c.replicas,
                          .rank = r,
                          .seed = 7,
                          .drop_last = c.drop_last});
    s.set_epoch(3);
    auto idx = s.indices();
    EXPECT_EQ(static_cast<int64_t>(idx.size()), s.num_samples());
    seen.insert(idx.begin(), idx.end());
    per_rank.push_back(idx);
    DistributedSampler again({.dataset_size = c.n,
                              .num_replicas = c.replicas,
                              .rank = r,
                              .seed = 7,
                              .drop_last = c.drop_last});
    again.set_epoch(3);
    EXPECT_EQ(again.indices(), idx) << "same (seed, epoch) must give the same order";
    again.set_epoch(4);
    EXPECT_NE(again.indices(), idx) << "another epoch must give another order";
  }
  const int64_t total = per_rank[0].size() * c.replicas;
  EXPECT_EQ(static_cast<int64_t>(seen.size()), total);
  std::set<int64_t> distinct(seen.begin(), seen.end());
  if (c.drop_last) {
    EXPECT_EQ(static_cast<int64_t>(distinct.size()), total) << "drop_last: no repeats";
    EXPECT_EQ(total, c.n / c.replicas * c.replicas);
  } else {
    EXPECT_EQ(static_cast<int64_t>(distinct.size()), c.n) << "every sample appears";
    EXPECT_EQ(total - c.n, (c.replicas - c.n % c.replicas) % c.replicas) << "padding is minimal";
  }
  for (auto i : distinct) EXPECT_TRUE(i >= 0 && i < c.n);
}

INSTANTIATE_TEST_SUITE_P(Sizes,
                         Sampler,
                         ::testing::Values(SamplerCase{100, 2, false},
                                           SamplerCase{101, 2, false},
                                           SamplerCase{101, 3, false},
                                           SamplerCase{10, 4, false},
                                           SamplerCase{101, 3, true},
                                           SamplerCase{60000, 2, false}));

TEST(SamplerOrder, MatchesPyTorchsPermutation) {
  // torch.randperm(10, generator=torch.Generator().manual_seed(5 + 2)) in PyTorch 1.13.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  auto expected = torch::randperm(10, gen, torch::kInt64);
  DistributedSampler s({.dataset_size = 10, .num_replicas = 2, .rank = 1, .seed = 5});
  s.set_epoch(2);
  auto idx = s.indices();
  for (int i = 0; i < 5; ++i) EXPECT_EQ(idx[i], expected[2 * i + 1].item<int64_t>());
}

TEST(SamplerResume, TailFromAStartPositionMatchesTheUninterruptedOrder) {
  // Same world size: resuming after 3 batches of 4 per rank gives exactly the rest of indices().
  for (int r = 0; r < 3; ++r) {
    DistributedSampler s({.dataset_size = 101, .num_replicas = 3, .rank = r, .seed = 1});
    s.set_epoch(2);
    const auto all = s.indices();
    const auto tail = s.indices(/*start=*/3 * 4 * 3);
    ASSERT_EQ(tail.size(), all.size() - 12);
    EXPECT_TRUE(std::equal(tail.begin(), tail.end(), all.begin() + 12));
  }
  // Another world size: the ranks split the remaining positions evenly and disjointly; a start
  // that is not a multiple of the replica count is rounded down.
  std::multiset<int64_t> rest;
  std::size_t count = 0;
  for (int r = 0; r < 2; ++r) {
    DistributedSampler s({.dataset_size = 100, .num_replicas = 2, .rank = r, .seed = 1});
    const auto tail = s.indices(/*start=*/33);
    if (r == 0) count = tail.size();
    EXPECT_EQ(tail.size(), count);
    rest.insert(tail.begin(), tail.end());
  }
  EXPECT_EQ(rest.size(), 100u - 32u);
  EXPECT_EQ(std::set<int64_t>(rest.begin(), rest.end()).size(), rest.size());
  DistributedSampler s({.dataset_size = 10, .num_replicas = 2, .rank = 0});
  EXPECT_TRUE(s.indices(/*start=*/10).empty());
  EXPECT_TRUE(s.indices(/*start=*/50).empty());
  EXPECT_THROW(s.indices(-1), trainyard::InvalidArgumentError);
}

TEST(SamplerOptionsCheck, RejectsBadRank) {
  EXPECT_THROW(DistributedSampler({.dataset_size = 10, .num_replicas = 2, .rank = 2}),
               trainyard::InvalidArgumentError);
}

TEST(Loader, YieldsEveryIndexInOrderAndPropagatesErrors) {
  std::vector<int64_t> indices(23);
  std::iota(indices.begin(), indices.end(), 0);
  BatchLoader loader(indices,
                     [](const std::vector<int64_t>& idx) {
                       return Batch{torch::tensor(idx, torch::kInt64), torch::Tensor()};
                     },
                     {.batch_size = 5, .prefetch = 2});
  EXPECT_EQ(loader.num_batches(), 5);
  std::vector<int64_t> got;
  while (auto b = loader.next()) {
    for (int64_t i = 0; i < b->inputs.size(0); ++i) got.push_back(b->inputs[i].item<int64_t>());
  }
  EXPECT_EQ(got, indices);

  BatchLoader failing(indices,
                      [](const std::vector<int64_t>& idx) -> Batch {
                        if (idx.front() >= 10) throw trainyard::Error("bad sample 10");
                        return Batch{};
                      },
                      {.batch_size = 5});
  EXPECT_TRUE(failing.next().has_value());
  EXPECT_TRUE(failing.next().has_value());
  EXPECT_THROW(failing.next(), trainyard::Error);
}

}  // namespace
