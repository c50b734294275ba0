// Tokenizer throughput in MB/s of UTF-8 text: hf::Tokenizer on a tokenizer.json (or the
// byte-level fallback for a directory without one), over text files and synthetic text.
// LibTorch-free. Usage:
//   tokenizer_bench TOKENIZER [--file PATH]... [--synthetic-mb N] [--threads N]
//                   [--ids-out PATH]
// For each input it times, line by line: "cold" (a fresh tokenizer, its word cache empty, on one
// thread), "warm" (the same tokenizer a second time) and "batch" (a fresh tokenizer, encode_batch
// on N threads). A small input is repeated until a pass holds at least 8 MB; "cold" then uses a
// fresh tokenizer for each of up to 20 repetitions. --ids-out writes the first input's ids, a line
// per line.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "trainyard/error.h"
#include "trainyard/hf/tokenizer.h"

namespace {

using trainyard::hf::Tokenizer;
using Clock = std::chrono::steady_clock;

struct Input {
  std::string name;
  std::vector<std::string> lines;
  std::size_t bytes = 0;
};

Input read_lines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TY_CHECK(in.good(), "Cannot read --file ", path, ".");
  Input input{path, {}, 0};
  for (std::string line; std::getline(in, line);) {
    input.bytes += line.size() + 1;
    input.lines.push_back(std::move(line));
  }
  return input;
}

// Pseudo-English: Zipf-distributed words of random syllables, punctuation, numbers, and now and
// then a non-ASCII word, in lines of 40 to 600 bytes. The same text for the same seed.
Input synthetic(double megabytes) {
  std::mt19937 rng(1234);
  const char* syllables[] = {"the", "an",  "to",  "in", "er", "on",  "at",  "re",  "st",   "ing",
                             "ed",  "or",  "al",  "ar", "ou", "le",  "con", "pro", "ment", "tion",
                             "ly",  "ver", "com", "ex", "de", "pre", "ab",  "mo",  "ka",   "zu"};
  std::vector<std::string> words;
  std::uniform_int_distribution<int> syllable(0, std::size(syllables) - 1);
  std::uniform_int_distribution<int> parts(1, 4);
  for (int i = 0; i < 20000; ++i) {
    std::string w;
    for (int n = parts(rng); n > 0; --n) w += syllables[syllable(rng)];
    words.push_back(w);
  }
  const char* foreign[] = {"café",   "naïve", "Zürich", "東京",      "中文",
                           "Москва", "😀",     "ﬁnal",   "cafe\u0301"};
  std::vector<double> weights(words.size());
  for (std::size_t i = 0; i < weights.size(); ++i) weights[i] = 1.0 / (i + 1);
  std::discrete_distribution<std::size_t> zipf(weights.begin(), weights.end());
  std::uniform_int_distribution<int> percent(0, 99);
  std::uniform_int_distribution<int> line_words(8, 100);
  std::uniform_int_distribution<int> number(0, 99999);
  Input input{"synthetic", {}, 0};
  const auto target = static_cast<std::size_t>(megabytes * 1e6);
  while (input.bytes < target) {
    std::string line;
    for (int n = line_words(rng); n > 0; --n) {
      const int p = percent(rng);
      if (!line.empty()) line += p < 2 ? "  " : " ";
      if (p < 3)
        line += foreign[p * 3 + percent(rng) % 3];
      else if (p < 6)
        line += std::to_string(number(rng));
      else if (p < 9)
        line += words[zipf(rng)] + "'s";
      else
        line += p < 15 ? "The" : words[zipf(rng)];
      if (p >= 90) line += p < 95 ? "," : ".";
    }
    input.bytes += line.size() + 1;
    input.lines.push_back(std::move(line));
  }
  return input;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void bench(const std::string& tokenizer_path, const Input& input, int threads, std::FILE* ids_out) {
  const auto load = [&] {
    return std::filesystem::is_directory(tokenizer_path) ? Tokenizer::from_directory(tokenizer_path)
                                                         : Tokenizer::from_file(tokenizer_path);
  };
  const std::size_t repeats = std::max<std::size_t>(1, (8'000'000 + input.bytes - 1) / input.bytes);
  const double megabytes = static_cast<double>(input.bytes * repeats) / 1e6;

  // A fresh tokenizer per repetition (loading is not timed), at most 20 of them.
  const std::size_t fresh_repeats = std::min<std::size_t>(repeats, 20);
  const double fresh_megabytes = static_cast<double>(input.bytes * fresh_repeats) / 1e6;
  double cold_s = 0;
  std::size_t tokens = 0;
  for (std::size_t r = 0; r < fresh_repeats; ++r) {
    const Tokenizer tok = load();
    const auto start = Clock::now();
    for (const auto& line : input.lines) tokens += tok.encode(line).size();
    cold_s += seconds_since(start);
  }
  const Tokenizer warm = load();
  for (const auto& line : input.lines) warm.encode(line);
  auto start = Clock::now();
  for (std::size_t r = 0; r < repeats; ++r)
    for (const auto& line : input.lines) warm.encode(line);
  const double warm_s = seconds_since(start);

  double batch_s = 0;
  std::vector<std::vector<std::int32_t>> ids;
  for (std::size_t r = 0; r < fresh_repeats; ++r) {
    const Tokenizer tok = load();
    start = Clock::now();
    ids = tok.encode_batch(input.lines, true, threads);
    batch_s += seconds_since(start);
  }
  if (ids_out) {
    for (const auto& line : ids) {
      for (std::size_t i = 0; i < line.size(); ++i)
        std::fprintf(ids_out, i ? " %d" : "%d", line[i]);
      std::fputc('\n', ids_out);
    }
  }
  std::printf(
      "%-40s %8.2f MB x%-4zu %6.2f bytes/token  cold %7.2f MB/s  warm %7.2f MB/s  "
      "batch(%d threads) %7.2f MB/s\n",
      input.name.c_str(), input.bytes / 1e6, repeats,
      static_cast<double>(input.bytes * fresh_repeats) / tokens, fresh_megabytes / cold_s,
      megabytes / warm_s, threads, fresh_megabytes / batch_s);
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s TOKENIZER_JSON_OR_DIR [--file PATH]... [--synthetic-mb N] "
                 "[--threads N] [--ids-out PATH]\n",
                 argv[0]);
    return 2;
  }
  const std::string tokenizer_path = argv[1];
  std::vector<Input> inputs;
  double synthetic_mb = 0;
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  std::string ids_out_path;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    TY_CHECK(i + 1 < argc, "Option ", arg, " needs a value.");
    if (arg == "--file")
      inputs.push_back(read_lines(argv[++i]));
    else if (arg == "--synthetic-mb")
      synthetic_mb = std::atof(argv[++i]);
    else if (arg == "--threads")
      threads = std::atoi(argv[++i]);
    else if (arg == "--ids-out")
      ids_out_path = argv[++i];
    else
      throw trainyard::InvalidArgumentError("Unknown option " + arg + ".");
  }
  if (synthetic_mb > 0) inputs.push_back(synthetic(synthetic_mb));
  std::FILE* ids_out = ids_out_path.empty() ? nullptr : std::fopen(ids_out_path.c_str(), "w");
  for (std::size_t i = 0; i < inputs.size(); ++i)
    bench(tokenizer_path, inputs[i], threads, i == 0 ? ids_out : nullptr);
  if (ids_out) std::fclose(ids_out);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
  return 1;
}
