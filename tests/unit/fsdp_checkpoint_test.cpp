// FSDP checkpoints: sharded and full round trips, resharding on load (W=2 -> 1 and 3, HYBRID ->
// FULL_SHARD) with bit-identical parameters and optimizer state, the next step after a resume,
// damaged shards, and multi-writer saves. Ranks are threads (thread_ranks.h); every rank has its
// own Checkpointer on one run folder, as the ranks of a job do.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <filesystem>
#include <fstream>
#include <map>

#include "../temp_dir.h"
#include "thread_ranks.h"
#include "tiny_gpt_neox.h"
#include "trainyard/checkpoint/checkpointer.h"
#include "trainyard/checkpoint/multi_writer_save.h"
#include "trainyard/checkpoint/safetensors.h"
#include "trainyard/error.h"
#include "trainyard/fsdp/fully_sharded_data_parallel.h"
#include "trainyard/fsdp/state_dict.h"
#include "trainyard/optim/state_key.h"

namespace trainyard::fsdp {
namespace {

namespace fs = std::filesystem;
using checkpoint::Checkpointer;
using models::GptNeoX;
using models::GptNeoXInit;

constexpr std::int64_t kRows = 6;  // sequences per step, split over 1, 2 or 3 ranks
constexpr std::int64_t kSeq = 8;
constexpr std::uint64_t kSeed = 11;
// Resuming at another world size sums gradients in another order: a few ulps, far below this
// relative bound per tensor after one step. (eps is large so that rounding noise in a gradient
// that is zero in exact arithmetic — the key bias — cannot become a full-size Adam step.)
constexpr double kTolerance = 1e-5;

using trainyard::test::TempDir;

using Params = std::map<std::string, torch::Tensor>;

// The optimizer's state of every flat shard, in order (step as a tensor).
using OptState = std::vector<std::map<std::string, torch::Tensor>>;

struct Job {
  int world = 2;
  Strategy strategy = Strategy::kFullShard;
  int local_world_size = 0;  // HYBRID: ranks per node
  bool pure_bf16 = false;    // bf16 shards and AdamW state (Note [Pure bf16])
};

struct Rank {
  int rank;
  int world;
  FullyShardedDataParallel<GptNeoX>& fsdp;
  torch::optim::AdamW& opt;
  c10d::Store& store;
  std::unique_ptr<Checkpointer> checkpointer;

  // Trains global steps [first, last): this rank's rows of each step's batch.
  void train(int first, int last) {
    const auto rows = kRows / world;
    for (int step = first; step < last; ++step) {
      opt.zero_grad();
      auto ids = testing::tiny_gpt_neox_batch(step, kRows, kSeq).narrow(0, rank * rows, rows);
      models::causal_lm_loss(fsdp.forward(ids), ids).backward();
      opt.step();
    }
  }
  Params full() {
    Params out;
    for (auto& [name, t] : fsdp.full_parameters()) out[name] = t;
    return out;
  }
  OptState optimizer_state() {
    OptState out;
    for (auto& p : fsdp.parameters()) {
      auto& s = static_cast<torch::optim::AdamWParamState&>(
          *opt.state().at(optim::optimizer_state_key(p)));
      out.push_back({{"exp_avg", s.exp_avg().clone()},
                     {"exp_avg_sq", s.exp_avg_sq().clone()},
                     {"step", torch::tensor(s.step())}});
    }
    return out;
  }
};

// Runs `body` on every rank of `job`, each with the tiny GPT-NeoX under FSDP (one unit per
// layer), an AdamW over its shards and a Checkpointer on `run`.
void with_ranks(const Job& job, const fs::path& run, const std::function<void(Rank&)>& body) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  testing::run_thread_ranks(job.world, [&](int rank, auto pg) {
    GptNeoX model(testing::tiny_gpt_neox_config(), GptNeoXInit{.seed = kSeed});
    auto groups = make_fsdp_groups(job.strategy, pg, store,
                                   job.local_world_size ? job.local_world_size : job.world);
    MixedPrecision precision;
    if (job.pure_bf16)
      precision = {.param_dtype = torch::kBFloat16,
                   .reduce_dtype = torch::kBFloat16,
                   .shard_dtype = torch::kBFloat16};
    FullyShardedDataParallel fsdp(
        model, groups,
        FsdpOptions{.sharding = job.strategy,
                    .wrap = wrap_modules_of_type<models::GptNeoXLayerImpl>(),
                    .mixed_precision = precision});
    torch::optim::AdamW opt(fsdp.parameters(),
                            torch::optim::AdamWOptions(1e-2).eps(1e-3).weight_decay(0.01));
    Rank r{rank,
           job.world,
           fsdp,
           opt,
           *store,
           std::make_unique<Checkpointer>(
               run.string(), checkpoint::CheckpointerOptions{.job_instance = "test-job"})};
    body(r);
  });
}

void expect_equal(const Params& expected, const Params& actual, const std::string& label) {
  ASSERT_EQ(expected.size(), actual.size()) << label;
  for (const auto& [name, e] : expected)
    EXPECT_TRUE(torch::equal(e, actual.at(name))) << label << ": " << name << " differs";
}

void expect_close(const Params& expected, const Params& actual, const std::string& label) {
  ASSERT_EQ(expected.size(), actual.size()) << label;
  for (const auto& [name, e] : expected) {
    const auto& a = actual.at(name);
    double rel = (e - a).norm().item<double>() / (e.norm().item<double>() + 1e-12);
    EXPECT_LT(rel, kTolerance) << label << ": " << name;
  }
}

void expect_equal(const OptState& expected, const OptState& actual, const std::string& label) {
  ASSERT_EQ(expected.size(), actual.size()) << label;
  for (std::size_t i = 0; i < expected.size(); ++i)
    for (const auto& [key, e] : expected[i])
      EXPECT_TRUE(torch::equal(e, actual[i].at(key))) << label << ": shard " << i << " " << key;
}

// Loads the newest checkpoint of `run` at world 1 and returns its parameters and optimizer state.
std::pair<Params, OptState> load_at_one(const fs::path& run, const Job& job = {.world = 1}) {
  std::pair<Params, OptState> out;
  with_ranks(job, run, [&](Rank& r) {
    ASSERT_TRUE(load_latest_checkpoint(r.fsdp, &r.opt, *r.checkpointer));
    out = {r.full(), r.optimizer_state()};
  });
  return out;
}

TEST(FsdpCheckpoint, ShardedStateReshardsAcrossWorldSizesBitForBit) {
  TempDir a, b;
  // Uninterrupted at W=2: 2 steps, saved, then a third.
  Params saved, next;
  with_ranks({.world = 2}, a.path(), [&](Rank& r) {
    r.train(0, 2);
    auto name =
        save_checkpoint(r.fsdp, &r.opt, *r.checkpointer, r.store, 2, {{"state.json", "{}"}});
    EXPECT_EQ(name, "checkpoint_000000");
    auto p = r.full();
    r.train(2, 3);
    auto q = r.full();
    if (r.rank == 0) saved = p, next = q;
  });
  ASSERT_TRUE(fs::exists(a.path() / "checkpoint_000000" / "shard_00000_of_00002.safetensors"));
  ASSERT_TRUE(fs::exists(a.path() / "checkpoint_000000" / "shard_00001_of_00002.safetensors"));
  ASSERT_TRUE(fs::exists(a.path() / "checkpoint_000000" / kShardedMetadataFile));

  auto [at_one, opt_at_one] = load_at_one(a.path());
  expect_equal(saved, at_one, "W=2 -> W=1 parameters");

  // W=2 -> W=2: the next step is the uninterrupted run's, bit for bit.
  with_ranks({.world = 2}, a.path(), [&](Rank& r) {
    auto loaded = load_latest_checkpoint(r.fsdp, &r.opt, *r.checkpointer, {"state.json"});
    ASSERT_TRUE(loaded);
    EXPECT_EQ(loaded->step, 2);
    EXPECT_EQ(loaded->extra.at("state.json"), "{}");
    r.train(2, 3);
    auto q = r.full();
    if (r.rank == 0) expect_equal(next, q, "W=2 -> W=2 next step");
  });

  // W=2 -> W=3: the same parameters; the next step within rounding; saved again at W=3 it holds
  // the same optimizer state as W=1 read from the W=2 checkpoint.
  with_ranks({.world = 3}, b.path(), [&](Rank& r) {
    Checkpointer from(a.path().string(), {.read_only = true});
    auto loaded = load_latest_checkpoint(r.fsdp, &r.opt, from);
    ASSERT_TRUE(loaded);
    EXPECT_EQ(loaded->saved_world_size, 2);
    auto p = r.full();
    if (r.rank == 0) expect_equal(saved, p, "W=2 -> W=3 parameters");
    save_checkpoint(r.fsdp, &r.opt, *r.checkpointer, r.store, 2);
    r.train(2, 3);
    auto q = r.full();
    if (r.rank == 0) expect_close(next, q, "W=2 -> W=3 next step");
  });
  auto [from_three, opt_from_three] = load_at_one(b.path());
  expect_equal(saved, from_three, "W=2 -> W=3 -> W=1 parameters");
  expect_equal(opt_at_one, opt_from_three, "W=2 -> W=3 -> W=1 optimizer state");
}

// Pure bf16 shards and moments are saved exactly (as fp32) and load bit for bit into bf16 shards at
// another world size, or into fp32 shards; the next step after a resume at the same world size is
// the uninterrupted run's.
TEST(FsdpCheckpoint, PureBf16StateRoundTripsExactlyIntoEitherKindOfShard) {
  TempDir a;
  Params saved, next;
  OptState saved_state;
  with_ranks({.world = 2, .pure_bf16 = true}, a.path(), [&](Rank& r) {
    r.train(0, 2);
    for (auto& p : r.fsdp.parameters()) {
      EXPECT_EQ(p.scalar_type(), torch::kBFloat16);
      EXPECT_EQ(p.grad().scalar_type(), torch::kBFloat16);
    }
    save_checkpoint(r.fsdp, &r.opt, *r.checkpointer, r.store, 2);
    auto p = r.full();
    r.train(2, 3);
    auto q = r.full();
    if (r.rank == 0) saved = p, next = q;
  });
  with_ranks({.world = 2, .pure_bf16 = true}, a.path(), [&](Rank& r) {
    ASSERT_TRUE(load_latest_checkpoint(r.fsdp, &r.opt, *r.checkpointer));
    r.train(2, 3);
    auto q = r.full();
    if (r.rank == 0) expect_equal(next, q, "pure bf16 W=2 -> W=2 next step");
  });
  auto [at_one, state_at_one] = load_at_one(a.path(), {.world = 1, .pure_bf16 = true});
  expect_equal(saved, at_one, "pure bf16 W=2 -> W=1 parameters");
  ASSERT_FALSE(state_at_one.empty());
  for (const auto& shard : state_at_one) {
    EXPECT_EQ(shard.at("exp_avg").scalar_type(), torch::kBFloat16);
    EXPECT_EQ(shard.at("exp_avg_sq").scalar_type(), torch::kBFloat16);
  }
  auto [as_fp32, fp32_state] = load_at_one(a.path());
  expect_equal(saved, as_fp32, "pure bf16 W=2 -> fp32 W=1 parameters");
  for (std::size_t i = 0; i < fp32_state.size(); ++i)
    for (const auto& key : {"exp_avg", "exp_avg_sq"}) {
      const auto& t = fp32_state[i].at(key);
      EXPECT_EQ(t.scalar_type(), torch::kFloat32);
      EXPECT_TRUE(torch::equal(t, state_at_one[i].at(key).to(torch::kFloat32)))
          << "shard " << i << " " << key << ": the bf16 values, exactly";
    }
}

// One process reads whole parameters out of a W=3 sharded checkpoint by ranges and gets the
// saved values; a shard whose size disagrees with the manifest is damage, named.
TEST(FsdpCheckpoint, ParametersAreReadWholeByRangesInOneProcess) {
  TempDir a;
  Params saved;
  with_ranks({.world = 3}, a.path(), [&](Rank& r) {
    r.train(0, 2);
    save_checkpoint(r.fsdp, &r.opt, *r.checkpointer, r.store, 2);
    auto p = r.full();
    if (r.rank == 0) saved = p;
  });
  Checkpointer c(a.path().string(), {.read_only = true});
  const auto manifest = c.read_manifest("checkpoint_000000");
  std::map<std::string, std::uint64_t> sizes;
  for (const auto& [file, digest] : manifest.files) sizes[file] = digest.bytes;
  std::int64_t bytes_read = 0;
  auto range = [&](const std::string& file, std::uint64_t offset, std::uint64_t length) {
    auto b = c.storage().read_range("checkpoint_000000/" + file, offset, length);
    bytes_read += static_cast<std::int64_t>(b->size());
    return *b;
  };
  const trainyard::fsdp::ShardedParameterReader reader(c.read_file(manifest, kShardedMetadataFile),
                                                       range, sizes, "ckpt");
  GptNeoX model(testing::tiny_gpt_neox_config(), GptNeoXInit{.seed = kSeed + 1});
  trainyard::fsdp::load_sharded_into_module(*model, reader, "ckpt");
  Params loaded;
  for (const auto& p : model->named_parameters()) loaded[p.key()] = p.value().detach().clone();
  expect_equal(saved, loaded, "read by ranges");
  std::int64_t state_bytes = 0;
  for (const auto& [file, digest] : manifest.files) state_bytes += digest.bytes;
  EXPECT_LT(bytes_read, state_bytes / 2) << "the optimizer's moments beside them are not read";

  auto wrong = sizes;
  wrong["shard_00001_of_00003.safetensors"] += 4;
  try {
    trainyard::fsdp::ShardedParameterReader damaged(c.read_file(manifest, kShardedMetadataFile),
                                                    range, wrong, "ckpt");
    FAIL() << "a size that disagrees with the manifest";
  } catch (const trainyard::CheckpointCorruptError& e) {
    EXPECT_NE(std::string(e.what()).find("ckpt/shard_00001_of_00003.safetensors"),
              std::string::npos)
        << e.what();
  }
}

TEST(FsdpCheckpoint, HybridSavesOneCopyAndLoadsAsFullShard) {
  TempDir run;
  Params saved;
  with_ranks({.world = 4, .strategy = Strategy::kHybridShard, .local_world_size = 2}, run.path(),
             [&](Rank& r) {
               r.train(0, 2);
               save_checkpoint(r.fsdp, &r.opt, *r.checkpointer, r.store, 2);
               auto p = r.full();
               if (r.rank == 0) saved = p;
             });
  std::vector<std::string> shards;
  for (auto& e : fs::directory_iterator(run.path() / "checkpoint_000000"))
    if (e.path().extension() == ".safetensors") shards.push_back(e.path().filename());
  EXPECT_EQ(shards.size(), 2u) << "one file per shard of a node; the other node's are equal";
  with_ranks({.world = 2}, run.path(), [&](Rank& r) {
    auto loaded = load_latest_checkpoint(r.fsdp, &r.opt, *r.checkpointer);
    ASSERT_TRUE(loaded);
    EXPECT_EQ(loaded->saved_strategy, Strategy::kHybridShard);
    auto p = r.full();
    if (r.rank == 0) expect_equal(saved, p, "HYBRID 2x2 -> FULL_SHARD W=2");
  });
}

TEST(FsdpCheckpoint, FullCheckpointIsHuggingFaceLayoutAndLoadsAtAnyWorldSize) {
  TempDir run;
  Params saved;
  with_ranks({.world = 2}, run.path(), [&](Rank& r) {
    r.train(0, 1);
    save_checkpoint(r.fsdp, &r.opt, *r.checkpointer, r.store, 1, {}, CheckpointFormat::kFull);
    auto p = r.full();
    if (r.rank == 0) saved = p;
  });
  const auto dir = run.path() / "checkpoint_000000";
  // The root unit and the three layers: four files, Hugging Face's names and index.
  for (int k = 1; k <= 4; ++k) {
    char file[64];
    std::snprintf(file, sizeof file, "model-%05d-of-00004.safetensors", k);
    EXPECT_TRUE(fs::exists(dir / file)) << file;
  }
  std::ifstream index(dir / kFullIndexFile);
  std::string text((std::istreambuf_iterator<char>(index)), {});
  EXPECT_NE(text.find("\"gpt_neox.layers.0.attention.query_key_value.weight\""), std::string::npos);
  EXPECT_NE(text.find("\"embed_out.weight\""), std::string::npos);

  with_ranks({.world = 3}, run.path(), [&](Rank& r) {
    auto loaded = load_latest_checkpoint(r.fsdp, &r.opt, *r.checkpointer);
    ASSERT_TRUE(loaded);
    EXPECT_EQ(loaded->format, CheckpointFormat::kFull);
    auto p = r.full();
    if (r.rank == 0) expect_equal(saved, p, "full W=2 -> W=3");
  });
}

// Flips one byte in the middle of a file: same size, another SHA-256.
void damage(const fs::path& file) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(fs::file_size(file) / 2));
  char c;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(fs::file_size(file) / 2));
  f.put(static_cast<char>(c ^ 0x5a));
}

TEST(FsdpCheckpoint, DamagedShardFallsBackToThePreviousCheckpointOnEveryRank) {
  TempDir run;
  Params first;
  with_ranks({.world = 2}, run.path(), [&](Rank& r) {
    r.train(0, 1);
    save_checkpoint(r.fsdp, &r.opt, *r.checkpointer, r.store, 1);
    auto p = r.full();
    if (r.rank == 0) first = p;
    r.train(1, 2);
    save_checkpoint(r.fsdp, &r.opt, *r.checkpointer, r.store, 2);
  });
  damage(run.path() / "checkpoint_000001" / "shard_00001_of_00002.safetensors");

  with_ranks({.world = 2}, run.path(), [&](Rank& r) {
    auto loaded = load_latest_checkpoint(r.fsdp, &r.opt, *r.checkpointer);
    ASSERT_TRUE(loaded);
    EXPECT_EQ(loaded->name, "checkpoint_000000");
    EXPECT_EQ(loaded->step, 1);
    auto p = r.full();
    if (r.rank == 0) expect_equal(first, p, "fell back to checkpoint_000000");
  });
  std::ifstream marker(run.path() / "checkpoint_000001" / Checkpointer::kDamaged);
  std::string why((std::istreambuf_iterator<char>(marker)), {});
  EXPECT_NE(why.find("rank 1"), std::string::npos) << why;
  EXPECT_NE(why.find("shard_00001_of_00002.safetensors does not match its SHA-256"),
            std::string::npos)
      << why;

  // A missing shard: nothing verifies, so both ranks start from scratch together.
  fs::remove(run.path() / "checkpoint_000000" / "shard_00000_of_00002.safetensors");
  with_ranks({.world = 2}, run.path(), [&](Rank& r) {
    EXPECT_FALSE(load_latest_checkpoint(r.fsdp, &r.opt, *r.checkpointer));
  });
  std::ifstream marker0(run.path() / "checkpoint_000000" / Checkpointer::kDamaged);
  std::string why0((std::istreambuf_iterator<char>(marker0)), {});
  EXPECT_NE(why0.find("shard_00000_of_00002.safetensors is missing"), std::string::npos) << why0;
}

TEST(FsdpCheckpoint, AnotherOptimizerOrModelIsAClearErrorNotDamage) {
  TempDir run;
  with_ranks({.world = 1}, run.path(), [&](Rank& r) {
    r.train(0, 1);
    save_checkpoint(r.fsdp, &r.opt, *r.checkpointer, r.store, 1);
    torch::optim::SGD sgd(r.fsdp.parameters(), torch::optim::SGDOptions(0.1));
    try {
      load_latest_checkpoint(r.fsdp, &sgd, *r.checkpointer);
      ADD_FAILURE() << "loading AdamW state into SGD did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("holds adamw optimizer state, but the optimizer given "
                                           "is sgd"),
                std::string::npos)
          << e.what();
    }
  });
  EXPECT_FALSE(fs::exists(run.path() / "checkpoint_000000" / Checkpointer::kDamaged));
}

TEST(MultiWriterSave, ARankThatFailsRemovesTheCheckpointOnEveryRank) {
  TempDir run;
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(3);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 3; ++rank)
    ranks.emplace_back([&, rank] {
      Checkpointer ckpt(run.path().string(), {.job_instance = "test-job"});
      try {
        checkpoint::MultiWriterSave save(ckpt, *store, rank, 3);
        save.write("part" + std::to_string(rank), "bytes of rank " + std::to_string(rank));
        if (rank == 2) throw std::runtime_error("disk full (simulated)");
        save.commit(7);
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (int rank : {0, 1})
    EXPECT_NE(errors[rank].find("rank 2: it stopped before committing"), std::string::npos)
        << "rank " << rank << ": " << errors[rank];
  Checkpointer reader(run.path().string(), {.read_only = true});
  EXPECT_TRUE(reader.list_complete().empty());
  EXPECT_FALSE(fs::exists(run.path() / "checkpoint_000000" / "part0"));

  // The next save of the same ranks completes with every rank's file.
  ranks.clear();
  std::vector<std::string> names(3);
  for (int rank = 0; rank < 3; ++rank)
    ranks.emplace_back([&, rank] {
      Checkpointer ckpt(run.path().string(), {.job_instance = "test-job"});
      checkpoint::MultiWriterSave save(ckpt, *store, rank, 3);
      save.write("part" + std::to_string(rank), "bytes of rank " + std::to_string(rank));
      names[rank] = save.commit(8);
    });
  for (auto& t : ranks) t.join();
  EXPECT_EQ(names[1], names[0]);
  EXPECT_EQ(names[2], names[0]);
  auto loaded = reader.load(names[0]);
  EXPECT_EQ(loaded.checkpoint.step, 8);
  EXPECT_EQ(loaded.checkpoint.files.size(), 3u);
  EXPECT_EQ(loaded.checkpoint.files.at("part2"), "bytes of rank 2");
}

TEST(Safetensors, RoundTripsAndNamesTheProblemInADamagedFile) {
  auto a = torch::arange(6, torch::kFloat32).view({2, 3});
  auto b = torch::tensor({1.5, -2.0}, torch::kBFloat16);
  auto bytes = checkpoint::encode_safetensors({{"a", a}, {"b", b}}, {{"k", "v"}});
  checkpoint::SafetensorsView view(bytes, "x.safetensors");
  EXPECT_TRUE(torch::equal(view.tensor("a"), a));
  EXPECT_TRUE(torch::equal(view.tensor("b"), b));
  EXPECT_EQ(view.metadata().at("k"), "v");
  EXPECT_EQ((bytes.size() - a.nbytes() - b.nbytes()) % 8, 0u) << "data 8-byte aligned";
  try {
    checkpoint::SafetensorsView(std::string_view(bytes).substr(0, bytes.size() - 3), "cut.st");
    ADD_FAILURE() << "a truncated file parsed";
  } catch (const CheckpointCorruptError& e) {
    EXPECT_NE(std::string(e.what()).find("cut.st is not a valid safetensors file: tensor b"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace trainyard::fsdp
