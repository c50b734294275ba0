// Hugging Face weight files: slices read from safetensors (single, sharded) and torch.save
// archives (plain, ZIP64, sharded) against the values torch wrote, every kind of bad input, and
// the streaming safetensors writer read back by our reader and by a Python parser.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "../temp_dir.h"
#include "trainyard/error.h"
#include "trainyard/hf/dtype.h"
#include "trainyard/hf/safetensors_file.h"
#include "trainyard/hf/safetensors_writer.h"
#include "trainyard/hf/torch_zip.h"
#include "trainyard/hf/weight_reader.h"

namespace trainyard::hf {
namespace {
namespace fs = std::filesystem;

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot open " << path;
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

int run_python(const std::string& args) {
  const std::string cmd =
      std::string(TRAINYARD_PYTHON) + " " + TRAINYARD_HF_FIXTURES_PY + " " + args + " 2>&1";
  return std::system(cmd.c_str());
}

// Every fixture directory hf_fixtures.py writes, made once for the suite (torch starts slowly).
class HfWeights : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/hf_weights_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = new fs::path(tmpl);
    ASSERT_EQ(run_python("make " + (*root_ / "fx").string()), 0) << "hf_fixtures.py make failed";
  }
  static void TearDownTestSuite() {
    if (root_) trainyard::test::remove_all(*root_);
    delete root_;
    root_ = nullptr;
  }
  static fs::path fx(const std::string& rel) { return *root_ / "fx" / rel; }
  static fs::path scratch(const std::string& rel) {
    const auto p = *root_ / "scratch" / rel;
    fs::create_directories(p);
    return p;
  }

  // Compares every tensor named in `expected_names` (file name prefix in exp/) with full and
  // sliced reads as F32, BF16, F16 and the stored dtype.
  static void expect_reads_match(const WeightReader& r, const std::string& exp_prefix) {
    for (const auto& name : r.names()) {
      SCOPED_TRACE(r.dir().string() + " tensor " + name);
      const TensorInfo& t = r.info(name);
      const fs::path exp = fx("exp/" + exp_prefix + name);
      const std::string raw = slurp(exp.string() + ".raw");
      ASSERT_EQ(raw.size(), t.nbytes());
      std::vector<Dtype> outs = {t.dtype};
      if (is_convertible(t.dtype, Dtype::F32))
        outs = {t.dtype, Dtype::F32, Dtype::BF16, Dtype::F16};
      for (const Dtype out : outs) {
        const std::string want = out == t.dtype       ? raw
                                 : out == Dtype::F32  ? slurp(exp.string() + ".f32")
                                 : out == Dtype::BF16 ? slurp(exp.string() + ".bf16")
                                                      : slurp(exp.string() + ".f16");
        const std::size_t es = element_size(out);
        const std::uint64_t n = t.numel();
        ASSERT_EQ(want.size(), n * es);
        // The whole tensor, halves as two ranks would read them, and odd slices.
        std::vector<std::pair<std::uint64_t, std::uint64_t>> slices = {
            {0, n}, {0, n / 2}, {n / 2, n - n / 2}};
        if (n > 7) slices.insert(slices.end(), {{1, n - 2}, {n - 3, 3}, {5, 1}, {n / 3, n / 3}});
        for (const auto& [begin, count] : slices) {
          std::string got(count * es, '\x55');
          r.read(name, begin, count, out, got.data());
          EXPECT_EQ(got, want.substr(begin * es, count * es))
              << "as " << dtype_name(out) << ", elements [" << begin << ", " << begin + count
              << ")";
        }
      }
    }
  }

  static fs::path* root_;
};
fs::path* HfWeights::root_ = nullptr;

template <typename E>
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "no exception";
}

// --- conversions --------------------------------------------------------------------------

TEST(HfDtype, SixteenBitFloatsSurviveTheRoundTripThroughF32) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float bf = bf16_to_f32(bits);
    const float hf = f16_to_f32(bits);
    if (!std::isnan(bf))
      EXPECT_EQ(f32_to_bf16(bf), bits) << std::hex << h;
    else
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(bf))));
    if (!std::isnan(hf))
      EXPECT_EQ(f32_to_f16(hf), bits) << std::hex << h;
    else
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(hf))));
    // fp16 by definition: sign, 5-bit exponent (bias 15), 10-bit mantissa.
    const int e = (h >> 10) & 31, m = h & 1023;
    const double mag = e == 0    ? std::ldexp(m, -24)
                       : e == 31 ? (m ? NAN : INFINITY)
                                 : std::ldexp(1024 + m, e - 25);
    const double want = (h & 0x8000) ? -mag : mag;
    if (!std::isnan(want)) {
      EXPECT_EQ(static_cast<double>(hf), want) << std::hex << h;
    }
  }
}

TEST(HfDtype, NarrowingRoundsToNearestEven) {
  // 1 + 2^-8 lies halfway between bf16 1 and 1 + 2^-7: even (1) wins; 1 + 3 * 2^-8 goes up.
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);  // above the tie
  EXPECT_EQ(f32_to_bf16(3.4028235e38f), 0x7f80);              // overflows to +inf
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // the first value that rounds to inf
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);  // halfway to the smallest subnormal: even (0)
  EXPECT_EQ(f32_to_f16(0x1.8p-25f), 0x0001);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(HfDtype, NamesSizesAndRefusedConversions) {
  EXPECT_EQ(parse_dtype("BF16"), Dtype::BF16);
  EXPECT_EQ(parse_dtype("F8_E4M3"), std::nullopt);
  EXPECT_EQ(element_size(Dtype::F16), 2u);
  EXPECT_EQ(element_size(Dtype::I64), 8u);
  std::int64_t i = 1;
  float f = 0;
  const auto msg =
      error_of<InvalidArgumentError>([&] { convert(&i, Dtype::I64, &f, Dtype::F32, 1); });
  EXPECT_NE(msg.find("Cannot convert I64 elements to F32"), std::string::npos) << msg;
}

// --- reading ------------------------------------------------------------------------------

TEST_F(HfWeights, SafetensorsSingleFileSlicesMatchWhatTorchWrote) {
  const WeightReader r(fx("st"));
  EXPECT_EQ(r.format(), WeightFormat::kSafetensors);
  const std::vector<std::string> want = {"embed.weight", "ln.bias", "mlp.weight",
                                         "special",      "double",  "scalar",
                                         "empty",        "steps",   "mask"};
  EXPECT_EQ(r.names(), want);  // file order
  EXPECT_EQ(r.info("mlp.weight").dtype, Dtype::BF16);
  EXPECT_EQ(r.info("mlp.weight").shape, (std::vector<std::int64_t>{24, 16}));
  EXPECT_EQ(r.info("scalar").shape, std::vector<std::int64_t>{});
  EXPECT_EQ(r.info("ln.bias").file, fx("st/model.safetensors"));
  expect_reads_match(r, "");
  EXPECT_NE(r.config_json().find("\"hidden_size\": 16"), std::string::npos);
}

TEST_F(HfWeights, ShardedSafetensorsFollowTheIndex) {
  const WeightReader r(fx("st_sharded"));
  EXPECT_EQ(r.format(), WeightFormat::kShardedSafetensors);
  EXPECT_EQ(r.names().size(), 9u);
  EXPECT_EQ(r.info("special").file, fx("st_sharded/model-00001-of-00002.safetensors"));
  EXPECT_EQ(r.info("steps").file, fx("st_sharded/model-00002-of-00002.safetensors"));
  expect_reads_match(r, "");
}

TEST_F(HfWeights, TorchSaveArchiveWithParametersSharedStoragesAndSixteenBitTypes) {
  for (const char* dir : {"bin", "bin_zip64", "bin_sharded"}) {
    const WeightReader r(fx(dir));
    const std::vector<std::string> want = {"weight", "bias", "shared.a", "shared.b",
                                           "half",   "bf16", "scalar",   "steps"};
    EXPECT_EQ(r.names(), want) << dir;
    EXPECT_EQ(r.info("half").dtype, Dtype::F16);
    EXPECT_EQ(r.info("bf16").dtype, Dtype::BF16);
    EXPECT_EQ(r.info("shared.b").shape, (std::vector<std::int64_t>{4, 5}));
    EXPECT_EQ(r.info("steps").dtype, Dtype::I64);
    expect_reads_match(r, "bin.");
  }
  EXPECT_EQ(WeightReader(fx("bin_sharded")).format(), WeightFormat::kShardedTorchBin);
  // The two views share one storage record, at element offsets 3 and 20.
  const auto a = list_torch_zip(fx("bin/pytorch_model.bin"));
  EXPECT_EQ(a[3].offset - a[2].offset, (20 - 3) * 4u);
}

TEST_F(HfWeights, ReadsOutsideATensorOrOfAMissingOneAreRefusedByName) {
  const WeightReader r(fx("st"));
  float buf[64];
  auto msg = error_of<InvalidArgumentError>([&] { r.read("ln.bias", 10, 7, Dtype::F32, buf); });
  EXPECT_NE(msg.find("elements [10, 17) of tensor 'ln.bias'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("it has 16"), std::string::npos) << msg;
  msg = error_of<InvalidArgumentError>([&] { r.read("nope.weight", 0, 1, Dtype::F32, buf); });
  EXPECT_NE(msg.find("no tensor 'nope.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(fx("st").string()), std::string::npos) << msg;
  msg = error_of<InvalidArgumentError>([&] { r.read("mask", 0, 1, Dtype::F32, buf); });
  EXPECT_NE(msg.find("'mask'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(BOOL) as F32"), std::string::npos) << msg;
  msg = error_of<CheckpointCorruptError>([&] {
    r.check_shape("embed.weight", {50304, 16}, "config.json: vocab_size 50304");
  });
  EXPECT_NE(msg.find("'embed.weight' in '" + fx("st/model.safetensors").string() +
                     "' has shape [37, 16], but config.json: vocab_size 50304 gives [50304, 16]"),
            std::string::npos)
      << msg;
  EXPECT_NO_THROW(r.check_shape("embed.weight", {37, 16}, "config.json"));
}

TEST_F(HfWeights, BadFilesAreRefusedNamingTheFileAndTheTensor) {
  struct Case {
    const char* dir;
    const char* file;
    std::vector<std::string> phrases;
  };
  const std::vector<Case> cases = {
      {"truncated_st", "model.safetensors", {"tensor 'steps'", "truncated"}},
      {"offsets_past_end_st", "model.safetensors", {"tensor 'special'", "header lies"}},
      {"overlap_st", "model.safetensors", {"tensor 'ln.bias'", "overlaps tensor 'embed.weight'"}},
      {"shape_vs_bytes_st",
       "model.safetensors",
       {"tensor 'embed.weight'", "shape [36, 16] needs 2304", "has 2368 bytes"}},
      {"header_length_st", "model.safetensors", {"header length 1099511627776"}},
      {"missing_shard",
       "model.safetensors.index.json",
       {"shard file 'model-00002-of-00002.safetensors'", "tensor 'mlp.weight'", "missing"}},
      {"index_names_absent_tensor",
       "model.safetensors.index.json",
       {"tensor 'ghost.weight'", "model-00001-of-00001.safetensors", "no such tensor"}},
      {"global_bin", "pytorch_model.bin", {"Python global 'posix system'", "allow-list"}},
      {"noncontiguous_bin",
       "pytorch_model.bin",
       {"tensor 't'", "shape [3, 2] with strides [1, 3]", "not contiguous"}},
      {"truncated_bin", "pytorch_model.bin", {"truncated"}},
  };
  for (const auto& c : cases) {
    const auto msg = error_of<CheckpointCorruptError>([&] { WeightReader r(fx("bad") / c.dir); });
    EXPECT_NE(msg.find((fx("bad") / c.dir / c.file).string()), std::string::npos)
        << c.dir << ": " << msg;
    for (const auto& p : c.phrases)
      EXPECT_NE(msg.find(p), std::string::npos) << c.dir << ": " << msg;
  }
  const auto msg = error_of<InvalidArgumentError>([&] { WeightReader r(fx("bad/empty")); });
  EXPECT_NE(msg.find("holds no model weights"), std::string::npos) << msg;
}

TEST_F(HfWeights, AFileCutShortAfterOpeningFailsTheReadNotTheProcess) {
  const fs::path dir = scratch("cut_after_open");
  fs::copy_file(fx("st/model.safetensors"), dir / "model.safetensors");
  const WeightReader r(dir);
  fs::resize_file(dir / "model.safetensors", r.info("embed.weight").offset + 100);
  std::vector<float> buf(37 * 16);
  const auto msg = error_of<CheckpointCorruptError>(
      [&] { r.read("embed.weight", 0, 37 * 16, Dtype::F32, buf.data()); });
  EXPECT_NE(msg.find("tensor 'embed.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST_F(HfWeights, ThreadsReadingOneReaderAtOnceEachGetTheirOwnSlices) {
  const WeightReader r(fx("bin"));
  const std::string want = slurp(fx("exp/bin.shared.b.bf16"));  // 20 elements, 40 bytes
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      for (int rep = 0; rep < 500; ++rep) {
        const std::uint64_t begin = (k * 5 + rep) % 20, count = 20 - begin;
        std::string got(count * 2, '\0');
        r.read("shared.b", begin, count, Dtype::BF16, got.data());
        wrong += got != want.substr(begin * 2);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST_F(HfWeights, OpensLocalPathsAndFileUrisAndExplainsS3) {
  EXPECT_EQ(WeightReader::open("file://" + fx("st").string()).names().size(), 9u);
  EXPECT_EQ(WeightReader::open(fx("bin").string()).names().size(), 8u);
  const auto msg = error_of<InvalidArgumentError>([] { WeightReader::open("s3://bucket/dolly"); });
  EXPECT_NE(msg.find("byte ranges"), std::string::npos) << msg;
  EXPECT_NE(msg.find("HINT"), std::string::npos) << msg;
}

// --- writing ------------------------------------------------------------------------------

// Streams every tensor of `src` into `writer` in awkward pieces: raw bytes in 1000-byte pieces
// that span tensors for all but "embed.weight", which is fed as F32 and converted to BF16.
template <typename Writer>
void stream_model(const WeightReader& src, Writer& writer, const std::string& converted) {
  for (const auto& name : src.names()) {
    const TensorInfo& t = src.info(name);
    std::string bytes(t.nbytes(), '\0');
    src.read(name, 0, t.numel(), t.dtype, bytes.data());
    if (name == converted) {
      std::vector<float> f32(t.numel());
      src.read(name, 0, t.numel(), Dtype::F32, f32.data());
      for (std::size_t i = 0; i < f32.size(); i += 100)
        writer.append(f32.data() + i, Dtype::F32, std::min<std::size_t>(100, f32.size() - i));
      continue;
    }
    for (std::size_t i = 0; i < bytes.size(); i += 1000)
      writer.append(bytes.data() + i, std::min<std::size_t>(1000, bytes.size() - i));
  }
}

std::vector<TensorSpec> specs_of(const WeightReader& r) {
  std::vector<TensorSpec> specs;
  for (const auto& name : r.names())
    specs.push_back({name, r.info(name).dtype, r.info(name).shape});
  return specs;
}

TEST_F(HfWeights, StreamedExportReadsBackHereAndInPython) {
  const WeightReader src(fx("st"));
  for (const std::uint64_t max_shard : {std::uint64_t(5'000'000'000), std::uint64_t(800)}) {
    SCOPED_TRACE("max_shard_bytes " + std::to_string(max_shard));
    const fs::path out = scratch("export_" + std::to_string(max_shard));
    // embed.weight is stored F32 in src; the export stores it BF16, fed F32 (converted).
    auto specs = specs_of(src);
    specs[0].dtype = Dtype::BF16;
    ShardedSafetensorsWriter writer(out, specs, {.max_shard_bytes = max_shard});
    stream_model(src, writer, "embed.weight");
    writer.finish();
    write_config_json(out, src.config_json());

    const WeightReader back(out);
    EXPECT_EQ(back.format(),
              max_shard == 800 ? WeightFormat::kShardedSafetensors : WeightFormat::kSafetensors);
    if (max_shard == 800) {
      // embed.weight (1184 bytes as BF16) alone | ln.bias + mlp.weight (32 + 768) | the rest.
      EXPECT_EQ(writer.shard_files().size(), 3u);
    }
    EXPECT_EQ(back.config_json(), src.config_json());
    for (const auto& name : src.names()) {
      const TensorInfo& t = src.info(name);
      EXPECT_EQ(back.info(name).shape, t.shape);
      const Dtype dt = name == "embed.weight" ? Dtype::BF16 : t.dtype;
      std::string want(t.numel() * element_size(dt), '\0'), got = want;
      src.read(name, 0, t.numel(), dt, want.data());
      back.read(name, 0, t.numel(), dt, got.data());
      EXPECT_EQ(got, want) << name;
    }
    for (const auto& entry : fs::directory_iterator(out))
      EXPECT_EQ(entry.path().string().find(".tmp."), std::string::npos) << entry.path();
  }
  // Python, parsing the files as the format describes, finds the same tensors.
  const fs::path ref = scratch("export_ref");
  {
    auto specs = specs_of(src);
    specs[0].dtype = Dtype::BF16;
    SafetensorsWriter writer(ref / "model.safetensors", specs);
    stream_model(src, writer, "embed.weight");
    writer.finish();
  }
  EXPECT_EQ(
      run_python("check-export " + scratch("export_5000000000").string() + " " + ref.string()), 0);
  EXPECT_EQ(run_python("check-export " + scratch("export_800").string() + " " + ref.string()), 0);
}

TEST_F(HfWeights, AnUnfinishedExportLeavesNoFileUnderTheFinalName) {
  const fs::path out = scratch("unfinished");
  {
    SafetensorsWriter writer(out / "model.safetensors", {{"w", Dtype::F32, {4}}});
    const float half[2] = {1, 2};
    writer.append(half, sizeof half);
    EXPECT_EQ(writer.current_tensor(), "w");
    EXPECT_EQ(writer.bytes_remaining(), 8u);
    const auto msg = error_of<InvalidArgumentError>([&] { writer.finish(); });
    EXPECT_NE(msg.find("tensor 'w'"), std::string::npos) << msg;
    const float too_much[4] = {};
    EXPECT_THROW(writer.append(too_much, sizeof too_much), InvalidArgumentError);
  }  // destroyed unfinished, as when an exception unwinds the export
  EXPECT_TRUE(fs::is_empty(out));
}

TEST_F(HfWeights, ShardPlanAndStaleFilesFollowSavePretrained) {
  // A new shard starts before the tensor that would overflow it; a large tensor stands alone.
  const std::vector<TensorSpec> specs = {{"a", Dtype::F32, {100}},
                                         {"b", Dtype::F32, {100}},
                                         {"huge", Dtype::F32, {1000}},
                                         {"c", Dtype::BF16, {10}}};
  EXPECT_EQ(plan_shards(specs, 800), (std::vector<std::vector<std::size_t>>{{0, 1}, {2}, {3}}));
  EXPECT_EQ(plan_shards(specs, 1u << 20), (std::vector<std::vector<std::size_t>>{{0, 1, 2, 3}}));

  const fs::path out = scratch("restale");
  auto write = [&](std::uint64_t max) {
    ShardedSafetensorsWriter w(out, specs, {.max_shard_bytes = max});
    std::vector<char> zeros(4000);
    w.append(zeros.data(), 800 + 4000 + 20);
    w.finish();
    return w.shard_files();
  };
  const auto three = write(800);
  EXPECT_EQ(three, (std::vector<std::string>{"model-00001-of-00003.safetensors",
                                             "model-00002-of-00003.safetensors",
                                             "model-00003-of-00003.safetensors"}));
  const auto index = slurp(out / "model.safetensors.index.json");
  EXPECT_NE(index.find("\"total_size\": 4820"), std::string::npos) << index;
  EXPECT_NE(index.find("\"huge\": \"model-00002-of-00003.safetensors\""), std::string::npos)
      << index;
  write(1u << 20);  // now one file: the index and the three shards must go
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(out)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(WeightReader(out).names().size(), 4u);
}

}  // namespace
}  // namespace trainyard::hf
