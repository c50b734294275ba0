// Reading a Hugging Face safetensors file by FSDP shards: each rank (one process each) reads
// only its 1/W of the flattened parameters and reports time and peak RSS (VmHWM), to show that a
// rank never needs the model's full size. LibTorch-free. Any model directory whose tensors hold
// value_at(tensor index, element index) (bench/python/hf_bin_model.py writes a torch.save one)
// can be read and checked.
//
//   hf_read_bench write DIR [MiB] [F32|BF16]    streams a model.safetensors of about MiB (1024)
//   hf_read_bench read DIR RANK WORLD [--out F32|BF16] [--hold] [--cold]
//     --hold keeps the rank's whole shard in one buffer (as FSDP's flat parameter does); without
//     it each slice goes through one reused buffer. --cold drops the file's cached pages first.
//   hf_read_bench convert [M]                     convert() throughput on M Mi elements (64)
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "trainyard/hf/safetensors_writer.h"
#include "trainyard/hf/weight_reader.h"

using namespace trainyard::hf;
namespace fs = std::filesystem;

namespace {

constexpr std::int64_t kRows = 2048, kCols = 4096;
constexpr std::uint64_t kStreamPieceElements = 4u << 20;  // per read() when not --hold

// The value every element holds: a hash of its tensor and index, in [-0.5, 0.5).
float value_at(std::size_t tensor, std::uint64_t i) {
  const std::uint32_t h = static_cast<std::uint32_t>((i + 1) * 2654435761u) ^
                          static_cast<std::uint32_t>(tensor * 40503u);
  return static_cast<float>(h >> 8) * 0x1p-24f - 0.5f;
}

long vm_hwm_kib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Compares every 997th of `count` elements at `dst` (tensor t's elements from `first` on) with
// value_at; returns the number that differ. A bf16 file holds value_at rounded to bf16.
std::uint64_t check_sample(
    const unsigned char* dst, Dtype out, std::size_t t, std::uint64_t first, std::uint64_t count) {
  std::uint64_t bad = 0;
  for (std::uint64_t i = 0; i < count; i += 997) {
    const float want = value_at(t, first + i);
    if (out == Dtype::F32) {
      float got;
      std::memcpy(&got, dst + i * 4, 4);
      bad += got != bf16_to_f32(f32_to_bf16(want)) && got != want;
    } else {
      std::uint16_t h;
      std::memcpy(&h, dst + i * 2, 2);
      bad += h != f32_to_bf16(want);
    }
  }
  return bad;
}

int write_model(const fs::path& dir, std::uint64_t mib, Dtype dtype) {
  fs::create_directories(dir);
  const std::uint64_t per_layer = (kRows * kCols + kCols) * element_size(dtype);
  const std::uint64_t layers = std::max<std::uint64_t>(1, (mib << 20) / per_layer);
  std::vector<TensorSpec> specs;
  for (std::uint64_t l = 0; l < layers; ++l) {
    specs.push_back({"layers." + std::to_string(l) + ".weight", dtype, {kRows, kCols}});
    specs.push_back({"layers." + std::to_string(l) + ".bias", dtype, {kCols}});
  }
  const auto t0 = std::chrono::steady_clock::now();
  ShardedSafetensorsWriter writer(dir, specs, {});
  std::vector<float> piece(1 << 20);  // fed in 4 MiB fp32 pieces, converted to `dtype`
  for (std::size_t t = 0; t < specs.size(); ++t)
    for (std::uint64_t i = 0; i < specs[t].numel(); i += piece.size()) {
      const std::uint64_t n = std::min<std::uint64_t>(piece.size(), specs[t].numel() - i);
      for (std::uint64_t k = 0; k < n; ++k) piece[k] = value_at(t, i + k);
      writer.append(piece.data(), Dtype::F32, n);
    }
  writer.finish();
  const auto bytes = fs::file_size(dir / kSafetensorsName);
  std::printf("wrote %s: %llu bytes, %zu tensors (%s) in %.2f s; peak RSS %ld MiB\n",
              (dir / kSafetensorsName).c_str(), static_cast<unsigned long long>(bytes),
              specs.size(), std::string(dtype_name(dtype)).c_str(), seconds_since(t0),
              vm_hwm_kib() / 1024);
  return 0;
}

int read_shard(const fs::path& dir, int rank, int world, Dtype out, bool hold, bool cold) {
  const auto t_open = std::chrono::steady_clock::now();
  const WeightReader reader(dir);
  const double open_secs = seconds_since(t_open);
  std::uint64_t total = 0;
  for (const auto& name : reader.names()) total += reader.info(name).numel();
  std::set<fs::path> files;
  for (const auto& name : reader.names()) files.insert(reader.info(name).file);
  std::uint64_t file_bytes = 0;
  for (const auto& f : files) {
    file_bytes += fs::file_size(f);
    if (cold) {  // drop this file's pages from the page cache (affects no other file)
      const int fd = ::open(f.c_str(), O_RDONLY);
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
  }
  // FSDP's flat parameter: every tensor flattened and concatenated, cut into W equal parts.
  const std::uint64_t shard = (total + world - 1) / world;
  const std::uint64_t begin = std::min<std::uint64_t>(total, shard * rank);
  const std::uint64_t end = std::min<std::uint64_t>(total, begin + shard);
  const std::size_t es = element_size(out);
  std::vector<unsigned char> held;
  std::vector<unsigned char> slice;
  if (hold) held.resize((end - begin) * es);
  const auto t0 = std::chrono::steady_clock::now();
  std::uint64_t flat = 0, read_elems = 0, mismatches = 0;
  for (std::size_t t = 0; t < reader.names().size(); ++t) {
    const auto& name = reader.names()[t];
    const std::uint64_t n = reader.info(name).numel();
    const std::uint64_t b = std::max(begin, flat), e = std::min(end, flat + n);
    if (b < e) {
      // Held: straight into the shard buffer. Streamed: in pieces through one buffer.
      const std::uint64_t piece = hold ? e - b : kStreamPieceElements;
      for (std::uint64_t pb = b; pb < e; pb += piece) {
        const std::uint64_t pe = std::min(e, pb + piece);
        unsigned char* dst;
        if (hold) {
          dst = held.data() + (pb - begin) * es;
        } else {
          slice.resize((pe - pb) * es);
          dst = slice.data();
        }
        reader.read(name, pb - flat, pe - pb, out, dst);
        mismatches += check_sample(dst, out, t, pb - flat, pe - pb);
      }
      read_elems += e - b;
    }
    flat += n;
  }
  const double secs = seconds_since(t0);
  std::printf(
      "rank %d/%d: %llu of %llu elements as %s (%s%s) in %.3f s (open %.3f s), %.2f GB/s of "
      "file bytes; peak RSS %ld MiB = %.1f%% of the %llu MiB of %s; %llu mismatches\n",
      rank, world, static_cast<unsigned long long>(read_elems),
      static_cast<unsigned long long>(total), std::string(dtype_name(out)).c_str(),
      hold ? "shard held" : "streamed", cold ? ", cold cache" : "", secs, open_secs,
      read_elems * element_size(reader.info(reader.names()[0]).dtype) / secs / 1e9,
      vm_hwm_kib() / 1024, 100.0 * vm_hwm_kib() * 1024 / file_bytes,
      static_cast<unsigned long long>(file_bytes >> 20),
      std::string(weight_format_name(reader.format())).c_str(),
      static_cast<unsigned long long>(mismatches));
  if (hold)
    std::printf("rank %d/%d: peak RSS beyond the %llu MiB shard buffer: %ld MiB\n", rank, world,
                static_cast<unsigned long long>(held.size() >> 20),
                vm_hwm_kib() / 1024 - static_cast<long>(held.size() >> 20));
  return mismatches == 0 ? 0 : 1;
}

int convert_speed(std::uint64_t mi) {
  const std::size_t n = mi << 20;
  std::vector<float> f32(n);
  std::vector<std::uint16_t> h16(n);
  for (std::size_t i = 0; i < n; ++i) f32[i] = value_at(0, i);
  struct Case {
    const char* what;
    const void* src;
    Dtype from;
    void* dst;
    Dtype to;
  };
  for (const Case c : {Case{"F32 -> BF16", f32.data(), Dtype::F32, h16.data(), Dtype::BF16},
                       Case{"BF16 -> F32", h16.data(), Dtype::BF16, f32.data(), Dtype::F32},
                       Case{"F32 -> F16", f32.data(), Dtype::F32, h16.data(), Dtype::F16},
                       Case{"F16 -> F32", h16.data(), Dtype::F16, f32.data(), Dtype::F32}}) {
    convert(c.src, c.from, c.dst, c.to, n);  // warm the pages
    const auto t0 = std::chrono::steady_clock::now();
    constexpr int kReps = 5;
    for (int r = 0; r < kReps; ++r) convert(c.src, c.from, c.dst, c.to, n);
    const double secs = seconds_since(t0) / kReps;
    std::printf("%s: %.1f M elements/s (%.2f GB/s read + written)\n", c.what, n / secs / 1e6,
                n * (element_size(c.from) + element_size(c.to)) / secs / 1e9);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::vector<std::string> a(argv + 1, argv + argc);
    if (a.size() >= 2 && a[0] == "write")
      return write_model(a[1], a.size() > 2 ? std::stoull(a[2]) : 1024,
                         a.size() > 3 ? parse_dtype(a[3]).value() : Dtype::F32);
    if (a.size() >= 4 && a[0] == "read") {
      Dtype out = Dtype::F32;
      bool hold = false, cold = false;
      for (std::size_t i = 4; i < a.size(); ++i) {
        if (a[i] == "--out" && i + 1 < a.size())
          out = parse_dtype(a[++i]).value();
        else if (a[i] == "--hold")
          hold = true;
        else if (a[i] == "--cold")
          cold = true;
      }
      return read_shard(a[1], std::stoi(a[2]), std::stoi(a[3]), out, hold, cold);
    }
    if (!a.empty() && a[0] == "convert")
      return convert_speed(a.size() > 1 ? std::stoull(a[1]) : 64);
    std::fprintf(stderr,
                 "usage: hf_read_bench write DIR [MiB] [F32|BF16]\n"
                 "       hf_read_bench read DIR RANK WORLD [--out F32|BF16] [--hold] [--cold]\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hf_read_bench: %s\n", e.what());
    return 1;
  }
}
