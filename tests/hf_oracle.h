// Hugging Face's own libraries as the tests' oracle: tests/unit/python/hf_oracle.py, run with the
// venv's python, gives transformers' logits and greedy ids on a model folder, PEFT's logits with
// an adapter on its base, and tiny random folders written by transformers' save_pretrained
// (sharded). Also the raw tensor files the reference scripts write, and a corpus whose bytes train
// the oracle's folders through the CLI.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "multiproc/multiproc_util.h"
#include "prerequisite.h"

namespace trainyard::test {

inline const std::filesystem::path kHfOraclePy =
    std::filesystem::path(TRAINYARD_SOURCE_DIR) / "tests/unit/python/hf_oracle.py";

// A raw little-endian file of `dtype` values (ids.i64, logits.f32), flat.
inline torch::Tensor read_raw_tensor(const std::filesystem::path& path, torch::ScalarType dtype) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const auto n = static_cast<std::int64_t>(bytes.size() / c10::elementSize(dtype));
  return torch::from_blob(bytes.data(), {n}, dtype).clone();
}

inline void write_raw_tensor(const std::filesystem::path& path, const torch::Tensor& t) {
  const auto c = t.contiguous();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
  if (!out.flush()) throw std::runtime_error("cannot write " + path.string());
}

// Why the venv's python cannot be the oracle, or "" when it can: it must import `modules`
// ("transformers" or "transformers, peft").
inline std::string hf_oracle_missing(const std::string& modules) {
  const auto r = mptest::run_program({TRAINYARD_PYTHON, "-c", "import " + modules}, {},
                                     std::chrono::seconds(60));
  if (r.status.success()) return "";
  return std::string(TRAINYARD_PYTHON " cannot import ") + modules +
         " (scripts/setup.sh installs it): " + r.err;
}

// The test's first statement where it asks the oracle: skips it (fails it under CI) without
// the venv's `modules`.
#define TY_REQUIRE_HF_ORACLE(modules)                                         \
  do {                                                                        \
    const auto hf_oracle_why = ::trainyard::test::hf_oracle_missing(modules); \
    if (!hf_oracle_why.empty()) TY_MISSING_PREREQUISITE(hf_oracle_why);       \
  } while (0)

// Runs hf_oracle.py with `args`; its output, or std::runtime_error with its stderr when it fails.
inline mptest::RunOutput run_hf_oracle(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {TRAINYARD_PYTHON, kHfOraclePy.string()};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = mptest::run_program(argv, {}, std::chrono::seconds(110));
  if (!r.status.success())
    throw std::runtime_error("hf_oracle.py " + args.front() + " failed (" +
                             (r.timed_out ? std::string("timed out") : r.status.to_string()) +
                             "): " + r.err);
  return r;
}

// A model folder and the ids (rows, T) int64 to compute its logits for.
struct OracleInput {
  std::filesystem::path folder;
  torch::Tensor ids;
};

// transformers' logits (rows, T, vocab_size), fp32, for each input, in one start of Python. Every
// input has the same number of rows. Throws, naming the folder and the tensors, when transformers
// refuses one (a tensor it would drop or initialise: see hf_oracle.py).
inline std::vector<torch::Tensor> transformers_logits(const std::vector<OracleInput>& inputs) {
  TempDir scratch("ty-hf-oracle");
  std::vector<std::string> args = {"logits"};
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(inputs[i].ids.size(0) == inputs[0].ids.size(0), "every input has as many rows");
    const auto ids = scratch.path() / ("ids" + std::to_string(i) + ".i64");
    write_raw_tensor(ids, inputs[i].ids.to(torch::kInt64));
    args.insert(args.end(), {inputs[i].folder.string(), ids.string(),
                             (scratch.path() / ("logits" + std::to_string(i) + ".f32")).string()});
  }
  args.insert(args.end(), {"--rows", std::to_string(inputs.at(0).ids.size(0))});
  run_hf_oracle(args);
  std::vector<torch::Tensor> out;
  for (std::size_t i = 0; i < inputs.size(); ++i)
    out.push_back(
        read_raw_tensor(scratch.path() / ("logits" + std::to_string(i) + ".f32"), torch::kFloat32)
            .view({inputs[i].ids.size(0), inputs[i].ids.size(1), -1}));
  return out;
}

// PEFT's logits (rows, T, vocab_size) with the adapter folder `adapter` (adapter_config.json,
// adapter_model.safetensors) on the model folder `base`.
inline torch::Tensor peft_logits(const std::filesystem::path& base,
                                 const std::filesystem::path& adapter,
                                 const torch::Tensor& ids) {
  TempDir scratch("ty-hf-oracle");
  write_raw_tensor(scratch.path() / "ids.i64", ids.to(torch::kInt64));
  run_hf_oracle({"peft", base.string(), adapter.string(), (scratch.path() / "ids.i64").string(),
                 (scratch.path() / "logits.f32").string(), "--rows", std::to_string(ids.size(0))});
  return read_raw_tensor(scratch.path() / "logits.f32", torch::kFloat32)
      .view({ids.size(0), ids.size(1), -1});
}

// Comma-separated ids ("3,1,4\n", as `trainyard generate --print-ids` and the oracle print them).
inline std::vector<std::int64_t> ids_of(const std::string& text) {
  std::vector<std::int64_t> ids;
  std::size_t at = 0;
  while (at < text.size() && text[at] != '\n') {
    std::size_t used = 0;
    ids.push_back(std::stoll(text.substr(at), &used));
    at += used;
    if (at < text.size() && text[at] == ',') ++at;
  }
  return ids;
}

// transformers' greedy continuation (model.generate, no end-of-text stop) of `prompt` by
// `max_new_tokens` ids on each folder, in one start of Python.
inline std::vector<std::vector<std::int64_t>> transformers_greedy(
    const std::vector<std::filesystem::path>& folders,
    const std::vector<std::int64_t>& prompt,
    std::int64_t max_new_tokens) {
  std::string ids;
  for (auto id : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  std::vector<std::string> args = {"greedy"};
  for (const auto& folder : folders)
    args.insert(args.end(), {folder.string(), std::to_string(max_new_tokens), ids});
  const auto out = run_hf_oracle(args).out;
  std::istringstream lines(out);
  std::vector<std::vector<std::int64_t>> continuations;
  for (std::string line; std::getline(lines, line);) continuations.push_back(ids_of(line));
  TORCH_CHECK(continuations.size() == folders.size(), "hf_oracle.py greedy printed ",
              continuations.size(), " lines for ", folders.size(), " folders: ", out);
  return continuations;
}

// Tiny random models written by transformers' save_pretrained as sharded safetensors, one per
// (folder, kind): "gpt_neox", "llama", "mistral", "qwen2" or "qwen3" (hf_oracle.py's KINDS: 256
// tokens, 2 layers, 64 positions), in one start of Python.
inline void transformers_save(
    const std::vector<std::pair<std::filesystem::path, std::string>>& folders) {
  std::vector<std::string> args = {"save"};
  for (const auto& [folder, kind] : folders) args.insert(args.end(), {folder.string(), kind});
  run_hf_oracle(args);
}

// 96 lines of English-like text, for training the oracle's 256-token folders on bytes (no
// tokenizer.json).
inline void write_byte_corpus(const std::filesystem::path& path) {
  const char* names[] = {"Anna", "Ben", "Cleo", "Dan"};
  const char* things[] = {"the report", "lunch", "the train", "a movie", "the keys", "dinner"};
  std::ofstream out(path);
  for (int i = 0; i < 96; ++i)
    out << names[i % 4] << " will bring " << things[(i * 5) % 6] << " to " << names[(i / 4) % 4]
        << " on day " << i % 7 << ".\n";
}

#ifdef TRAINYARD_CLI_PATH
// The command line of `trainyard train causal-lm` from the model folder `model` on
// write_byte_corpus's lines (written here, to storage/corpus.txt): one rank, fp32, sequences of
// 32 bytes, batches of 4, as the run `name` under `storage`; `more` flags after these.
inline std::vector<std::string> train_on_bytes_command(const std::filesystem::path& model,
                                                       const std::filesystem::path& storage,
                                                       const std::string& name,
                                                       const std::vector<std::string>& more) {
  write_byte_corpus(storage / "corpus.txt");
  std::vector<std::string> args = {TRAINYARD_CLI_PATH,
                                   "train",
                                   "causal-lm",
                                   "--model",
                                   model.string(),
                                   "--data",
                                   (storage / "corpus.txt").string(),
                                   "--seq-len",
                                   "32",
                                   "--batch-size",
                                   "4",
                                   "--workers",
                                   "1",
                                   "--precision",
                                   "fp32",
                                   "--storage",
                                   storage.string(),
                                   "--name",
                                   name,
                                   "--no-progress"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}
#endif

}  // namespace trainyard::test
