// trainyard::plan: the ZeRO paper's figures, the engine's model states against what its FSDP
// reports, activations, the verdict, and the flags' errors.
#include "trainyard/plan/memory_plan.h"

#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "../temp_dir.h"
#include "trainyard/error.h"

namespace trainyard::plan {
namespace {

using models::GptNeoXConfig;

// The figure as the paper prints it: GB (1e9 bytes) to one decimal.
double paper_gb(double bytes) {
  return std::round(bytes / 1e8) / 10;
}

const StrategyPlan& row(const MemoryPlan& plan, Strategy s) {
  for (const auto& r : plan.rows)
    if (r.strategy == s) return r;
  throw std::runtime_error("no row for " + std::string(display_name(s)));
}

// The message of the InvalidArgumentError `f` throws ("" when it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  return "";
}

TEST(MemoryPlan, ReproducesTheZeroPaperFigures) {
  // Rajbhandari et al. 2020, figure 1: 7.5B parameters, N_d = 64, K = 12.
  const auto plan = plan_memory(
      {.parameter_count = 7'500'000'000, .precision = Precision::kBf16Mixed, .world_size = 64});
  EXPECT_EQ(paper_gb(row(plan, Strategy::kDdp).paper_total()), 120.0);
  EXPECT_EQ(paper_gb(row(plan, Strategy::kZero1).paper_total()), 31.4);
  EXPECT_EQ(paper_gb(row(plan, Strategy::kShardGradOp).paper_total()), 16.6);
  EXPECT_EQ(paper_gb(row(plan, Strategy::kFullShard).paper_total()), 1.9);
  // Unrounded: (2 + 2 + 12) Psi, 4 Psi + 12 Psi / 64, 2 Psi + 14 Psi / 64, 16 Psi / 64.
  EXPECT_DOUBLE_EQ(row(plan, Strategy::kZero1).paper_total(), 31.40625e9);
  EXPECT_DOUBLE_EQ(row(plan, Strategy::kShardGradOp).paper_total(), 16.640625e9);
  EXPECT_DOUBLE_EQ(row(plan, Strategy::kFullShard).paper_total(), 1.875e9);
  // The printed table rounds the same way.
  const auto text = format_plan(plan, /*decimal=*/true);
  EXPECT_NE(text.find("GB (1e9 bytes)"), std::string::npos) << text;
  for (const char* figure : {" 120\n", " 31.4\n", " 16.6\n", " 1.9\n"})
    EXPECT_NE(text.find(figure), std::string::npos) << figure << " missing in\n" << text;
}

TEST(MemoryPlan, Fp32CountsFourFourAndEightBytes) {
  const auto k = zero_paper_state_bytes(Precision::kFp32);
  EXPECT_EQ(k.params + k.grads + k.optimizer, 16);
  EXPECT_EQ(k.optimizer, 8);
  const auto plan =
      plan_memory({.parameter_count = 1'000'000, .precision = Precision::kFp32, .world_size = 4});
  EXPECT_DOUBLE_EQ(row(plan, Strategy::kDdp).paper_total(), 16e6);
  EXPECT_DOUBLE_EQ(row(plan, Strategy::kZero1).paper_total(), 8e6 + 8e6 / 4);
  EXPECT_DOUBLE_EQ(row(plan, Strategy::kShardGradOp).paper_total(), 4e6 + 12e6 / 4);
  EXPECT_DOUBLE_EQ(row(plan, Strategy::kFullShard).paper_total(), 16e6 / 4);
}

TEST(MemoryPlan, HybridShardsWithinANode) {
  const auto plan = plan_memory({.parameter_count = 1'600'000'000,
                                 .precision = Precision::kBf16Mixed,
                                 .world_size = 16,
                                 .gpus_per_node = 8});
  EXPECT_DOUBLE_EQ(row(plan, Strategy::kHybridShard).paper_total(), 16 * 1.6e9 / 8);
  EXPECT_DOUBLE_EQ(row(plan, Strategy::kFullShard).paper_total(), 16 * 1.6e9 / 16);
}

TEST(MemoryPlan, ParameterCountOfEveryPresetIsTheConfigs) {
  for (const auto& name : GptNeoXConfig::preset_names()) {
    const auto config = GptNeoXConfig::preset(name);
    const auto plan = plan_memory({.model = config, .seq_len = 16});
    EXPECT_EQ(plan.parameter_count, config.parameter_count()) << name;
    // DDP's engine keeps 16 bytes per parameter between steps (fp32 weights, gradients, moments).
    EXPECT_DOUBLE_EQ(row(plan, Strategy::kDdp).persistent, 16.0 * config.parameter_count()) << name;
  }
  // What trainyard's FSDP logs for pythia-70m: "70426624 parameter elements".
  EXPECT_EQ(GptNeoXConfig::preset("pythia-70m").parameter_count(), 70'426'624);
}

TEST(MemoryPlan, FsdpShardsAreWhatTheEngineKeeps) {
  // pythia-70m at W = 2: FullyShardedDataParallel logs "140853248 bytes of sharded state on this
  // rank" (fp32 shards of 9 padded units), and train_gpt_fsdp prints 4x that (shards, gradients,
  // two moments) as "model state 537.3 MiB" for every sharding strategy.
  const auto plan = plan_memory({.model = GptNeoXConfig::preset("pythia-70m"),
                                 .precision = Precision::kFp32,
                                 .world_size = 2,
                                 .seq_len = 256,
                                 .micro_batch = 4});
  for (auto s : {Strategy::kShardGradOp, Strategy::kFullShard, Strategy::kHybridShard})
    EXPECT_DOUBLE_EQ(row(plan, s).persistent, 4.0 * 140853248) << display_name(s);
  EXPECT_DOUBLE_EQ(plan_strategy(plan.options, Strategy::kNoShard).persistent, 4.0 * 281706496);
}

TEST(MemoryPlan, ActivationCheckpointingLowersActivations) {
  for (auto precision : {Precision::kFp32, Precision::kBf16Mixed}) {
    PlanOptions options{.model = GptNeoXConfig::preset("pythia-410m"),
                        .precision = precision,
                        .world_size = 8,
                        .seq_len = 2048,
                        .micro_batch = 4};
    const auto full = activation_bytes(*options.model, 2048, 4, precision, false);
    const auto ckpt = activation_bytes(*options.model, 2048, 4, precision, true);
    EXPECT_LT(ckpt.layers, full.layers / 10);
    EXPECT_EQ(ckpt.per_layer, full.per_layer);
    EXPECT_EQ(ckpt.recompute, full.per_layer);
    const auto without = plan_memory(options);
    options.activation_checkpointing = true;
    const auto with = plan_memory(options);
    for (std::size_t i = 0; i < with.rows.size(); ++i) {
      EXPECT_LT(with.rows[i].activations, without.rows[i].activations)
          << display_name(with.rows[i].strategy);
      EXPECT_EQ(with.rows[i].persistent, without.rows[i].persistent);
    }
  }
}

TEST(MemoryPlan, ActivationsGrowWithBatchAndSequence) {
  const models::CausalLmConfig config = GptNeoXConfig::preset("pythia-160m");
  const auto base = activation_bytes(config, 512, 2, Precision::kBf16Mixed, false);
  const auto batch = activation_bytes(config, 512, 4, Precision::kBf16Mixed, false);
  const auto seq = activation_bytes(config, 1024, 2, Precision::kBf16Mixed, false);
  EXPECT_DOUBLE_EQ(batch.layers, 2 * base.layers);  // linear in the batch
  EXPECT_GT(seq.layers, 2 * base.layers);           // the attention scores are quadratic in T
  const auto fp32 = activation_bytes(config, 512, 2, Precision::kFp32, false);
  EXPECT_GT(fp32.layers, base.layers);
}

TEST(MemoryPlan, ShardingNeverCostsMore) {
  for (auto precision : {Precision::kFp32, Precision::kBf16Mixed}) {
    const auto plan = plan_memory({.model = GptNeoXConfig::preset("dolly-v2-7b"),
                                   .precision = precision,
                                   .world_size = 8,
                                   .seq_len = 2048});
    EXPECT_LE(row(plan, Strategy::kZero1).total(), row(plan, Strategy::kDdp).total());
    EXPECT_LE(row(plan, Strategy::kShardGradOp).total(), row(plan, Strategy::kZero1).total());
    EXPECT_LE(row(plan, Strategy::kFullShard).total(), row(plan, Strategy::kShardGradOp).total());
    EXPECT_LE(row(plan, Strategy::kZero1).paper_total(), row(plan, Strategy::kDdp).paper_total());
  }
}

TEST(MemoryPlan, RecommendsTheLeastCommunicationThatFits) {
  PlanOptions options{.model = GptNeoXConfig::preset("dolly-v2-7b"),
                      .precision = Precision::kBf16Mixed,
                      .world_size = 8,
                      .seq_len = 2048,
                      .activation_checkpointing = true,
                      .device_memory_bytes = std::int64_t{80} << 30};
  auto plan = plan_memory(options);
  ASSERT_TRUE(plan.recommended.has_value());
  for (const auto& r : plan.rows) {
    EXPECT_EQ(r.fits, r.total() <= 0.9 * static_cast<double>(std::int64_t{80} << 30));
    if (r.strategy == *plan.recommended) break;
    EXPECT_FALSE(r.fits) << display_name(r.strategy) << " fits but comes before the recommendation";
  }
  EXPECT_NE(format_plan(plan).find("Recommended: " + std::string(display_name(*plan.recommended))),
            std::string::npos);
  // DDP needs 16 bytes per parameter beyond activations: 7B does not fit on 80 GiB.
  EXPECT_FALSE(row(plan, Strategy::kDdp).fits);
  // 1 TiB devices fit everything: DDP, the least communication.
  options.device_memory_bytes = std::int64_t{1} << 40;
  EXPECT_EQ(plan_memory(options).recommended, Strategy::kDdp);
  // Tiny devices fit nothing, and the text says so.
  options.device_memory_bytes = std::int64_t{1} << 30;
  plan = plan_memory(options);
  EXPECT_FALSE(plan.recommended.has_value());
  EXPECT_NE(format_plan(plan).find("Nothing fits"), std::string::npos);
}

TEST(MemoryPlan, ParsesSizesAndCounts) {
  EXPECT_EQ(parse_byte_size("24GiB", "--gpu-mem"), std::int64_t{24} << 30);
  EXPECT_EQ(parse_byte_size("80GB", "--gpu-mem"), 80'000'000'000);
  EXPECT_EQ(parse_byte_size("80gb", "--gpu-mem"), 80'000'000'000);
  EXPECT_EQ(parse_byte_size("80G", "--gpu-mem"), 80'000'000'000);
  EXPECT_EQ(parse_byte_size("512MiB", "--gpu-mem"), std::int64_t{512} << 20);
  EXPECT_EQ(parse_byte_size("1.5TB", "--gpu-mem"), 1'500'000'000'000);
  EXPECT_EQ(parse_byte_size("1073741824", "--gpu-mem"), std::int64_t{1} << 30);
  EXPECT_EQ(parse_byte_size("0", "--runtime-mem"), 0);
  EXPECT_EQ(parse_count("7.5e9", "--params"), 7'500'000'000);
  EXPECT_EQ(parse_count("6.9B", "--params"), 6'900'000'000);
  EXPECT_EQ(parse_count("410M", "--params"), 410'000'000);
  EXPECT_EQ(parse_count("70000000", "--params"), 70'000'000);
}

TEST(MemoryPlan, BadFlagsNameTheFlag) {
  for (const char* bad : {"", "GiB", "24 GiB", "24XB", "-1GB", "nanGB", "infGB", "1e30B"}) {
    const auto message = error_of([&] { parse_byte_size(bad, "--gpu-mem"); });
    EXPECT_NE(message.find("--gpu-mem"), std::string::npos) << "'" << bad << "': " << message;
    EXPECT_NE(message.find("GiB"), std::string::npos) << message;  // says what it takes
  }
  for (const char* bad : {"", "lots", "7.5x", "-3"}) {
    const auto message = error_of([&] { parse_count(bad, "--params"); });
    EXPECT_NE(message.find("--params"), std::string::npos) << "'" << bad << "': " << message;
  }
  EXPECT_NE(error_of([] { parse_precision("fp16"); }).find("--precision"), std::string::npos);
  EXPECT_NE(error_of([] { parse_strategy("zero3", kPlannedStrategies); }).find("full_shard"),
            std::string::npos);
  const auto model = error_of([] { resolve_model("pythia-7b"); });
  EXPECT_NE(model.find("--model"), std::string::npos) << model;
  EXPECT_NE(model.find("pythia-70m"), std::string::npos) << model;  // lists the presets

  const PlanOptions ok{.model = GptNeoXConfig::preset("pythia-14m"), .seq_len = 64};
  auto check = [&](const char* flag, auto change) {
    PlanOptions o = ok;
    change(o);
    const auto message = error_of([&] { plan_memory(o); });
    EXPECT_NE(message.find(flag), std::string::npos) << flag << ": " << message;
  };
  check("--gpus", [](PlanOptions& o) { o.world_size = 0; });
  check("--gpus-per-node", [](PlanOptions& o) {
    o.world_size = 12;
    o.gpus_per_node = 8;
  });
  check("--seq-len", [](PlanOptions& o) { o.seq_len = 1; });
  check("--seq-len", [](PlanOptions& o) { o.seq_len = 4096; });  // past max_position_embeddings
  check("--batch-size", [](PlanOptions& o) { o.micro_batch = 0; });
  check("--headroom", [](PlanOptions& o) { o.headroom = 1; });
  check("--model", [](PlanOptions& o) { o.model.reset(); });
}

TEST(MemoryPlan, ReadsAConfigJsonOrItsDirectory) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("trainyard_plan_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto config = GptNeoXConfig::preset("pythia-160m");
  std::ofstream(dir / "config.json") << config.to_json();
  EXPECT_EQ(resolve_model((dir / "config.json").string()), config);
  EXPECT_EQ(resolve_model(dir.string()), config);
  std::ofstream(dir / "config.json") << R"({"model_type": "gemma"})";  // not an architecture here
  const auto message = error_of([&] { resolve_model(dir.string()); });
  EXPECT_NE(message.find("--model"), std::string::npos) << message;
  EXPECT_NE(message.find("gpt_neox"), std::string::npos) << message;
  trainyard::test::remove_all(dir);
}

TEST(MemoryPlan, AParameterCountAlonePlansModelStatesOnly) {
  const auto plan = plan_memory({.parameter_count = 7'500'000'000,
                                 .world_size = 64,
                                 .device_memory_bytes = std::int64_t{80} << 30});
  for (const auto& r : plan.rows) EXPECT_EQ(r.activations, 0) << display_name(r.strategy);
  // FULL_SHARD's engine keeps the fp32 shard, its gradient and two moments: 16 Psi / 64.
  EXPECT_DOUBLE_EQ(row(plan, Strategy::kFullShard).total(), 16 * 7.5e9 / 64);
  EXPECT_NE(format_plan(plan).find("need the model's"), std::string::npos);
}

}  // namespace
}  // namespace trainyard::plan

namespace trainyard::plan {
namespace {

PlanOptions pythia_70m_on_two_cpu_ranks(Precision precision, bool checkpointing = false) {
  return {.model = models::GptNeoXConfig::preset("pythia-70m"),
          .precision = precision,
          .world_size = 2,
          .seq_len = 256,
          .micro_batch = 4,
          .activation_checkpointing = checkpointing,
          .runtime_bytes = kCpuRuntimeBytes,
          .cpu_ranks = true};
}

TEST(MemoryPlan, CpuRanksCountTheAllocatorsPoolsAndTheNodesBuckets) {
  for (auto precision : {Precision::kFp32, Precision::kBf16Mixed}) {
    auto cpu = pythia_70m_on_two_cpu_ranks(precision);
    auto device = cpu;
    device.cpu_ranks = false;
    for (auto s :
         {Strategy::kDdp, Strategy::kShardGradOp, Strategy::kFullShard, Strategy::kNoShard}) {
      const auto on_cpu = plan_strategy(cpu, s), on_device = plan_strategy(device, s);
      // The pools' sum is at least the largest single moment; the resident state is the same.
      EXPECT_GE(on_cpu.total(), on_device.total()) << display_name(s);
      EXPECT_EQ(on_cpu.persistent, on_device.persistent) << display_name(s);
    }
    // DDP's ranks each count the peer's shared-memory bucket (4 bytes per parameter) too.
    const double psi = 70'426'624;
    EXPECT_DOUBLE_EQ(plan_strategy(cpu, Strategy::kDdp).grads, 8 * psi);
    EXPECT_DOUBLE_EQ(plan_strategy(device, Strategy::kDdp).grads, 4 * psi);
  }
}

TEST(MemoryPlan, AgreesWithTheMeasuredPeakRssOfTrainGptFsdp) {
  // bench/plan_vs_measured.sh's first run on this project's 2-core VM (2026-11-24, main at
  // 253ba55): the largest rank's peak RSS in MiB printed by train_gpt_fsdp for pythia-70m, seq
  // 256, batch 4 per rank, 2 ranks, 4 steps. The calibration of kCpuRuntimeBytes came from these;
  // the bar is the issue's 10%.
  struct Measured {
    Strategy strategy;
    Precision precision;
    bool checkpointing;
    int gpus_per_node;
    double peak_rss_mib;
  };
  const Measured runs[] = {
      {Strategy::kDdp, Precision::kFp32, false, 2, 2774.2},
      {Strategy::kDdp, Precision::kBf16Mixed, false, 2, 2704.4},
      {Strategy::kNoShard, Precision::kFp32, false, 2, 2634.8},
      {Strategy::kNoShard, Precision::kBf16Mixed, false, 2, 2658.8},
      {Strategy::kShardGradOp, Precision::kFp32, false, 2, 2416.8},
      {Strategy::kShardGradOp, Precision::kBf16Mixed, false, 2, 2119.5},
      {Strategy::kFullShard, Precision::kFp32, false, 2, 2283.1},
      {Strategy::kFullShard, Precision::kBf16Mixed, false, 2, 2048.0},
      {Strategy::kHybridShard, Precision::kFp32, false, 2, 2300.3},
      {Strategy::kHybridShard, Precision::kBf16Mixed, false, 2, 2058.2},
      {Strategy::kFullShard, Precision::kFp32, true, 2, 2102.5},
      {Strategy::kFullShard, Precision::kBf16Mixed, true, 2, 2000.1},
      {Strategy::kHybridShard, Precision::kFp32, false, 1, 2637.9},  // two nodes of one rank
      {Strategy::kHybridShard, Precision::kBf16Mixed, false, 1, 2574.0},
  };
  for (const auto& m : runs) {
    auto options = pythia_70m_on_two_cpu_ranks(m.precision, m.checkpointing);
    options.gpus_per_node = m.gpus_per_node;
    const double planned = plan_strategy(options, m.strategy).total() / 1048576;
    EXPECT_NEAR(planned / m.peak_rss_mib, 1.0, 0.10)
        << display_name(m.strategy) << " " << to_string(m.precision)
        << (m.checkpointing ? " checkpointing" : "") << ": planned " << planned << " MiB, measured "
        << m.peak_rss_mib << " MiB";
  }
}

}  // namespace
}  // namespace trainyard::plan
