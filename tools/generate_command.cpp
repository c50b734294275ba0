#include "tools/generate_command.h"

#include <torch/torch.h>

#include <cstdio>
#include <sstream>

#include "trainyard/error.h"
#include "trainyard/models/generate.h"
#include "trainyard/train/causal_lm.h"

namespace trainyard::cli {
namespace {

struct GenerateFlags {
  std::string model;
  std::string prompt;
  std::string prompt_ids;  // "1,2,3"
  bool print_ids = false;
  int threads = 0;
  models::GenerateOptions options;
};

std::vector<std::int64_t> parse_ids(const std::string& text) {
  std::vector<std::int64_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      std::size_t used = 0;
      ids.push_back(std::stoll(item, &used));
      TY_CHECK(used == item.size(), "");
    } catch (const std::exception&) {
      throw InvalidArgumentError(detail::concat(
          "--prompt-ids takes comma-separated token ids (e.g. 510,1775,27), got '", text, "'."));
    }
  }
  return ids;
}

std::string join_ids(const std::vector<std::int64_t>& ids) {
  std::string out;
  for (auto id : ids) out += (out.empty() ? "" : ",") + std::to_string(id);
  return out;
}

int run_generate(const GenerateFlags& f) {
  f.options.validate();
  TY_CHECK(f.prompt.empty() != f.prompt_ids.empty(),
           "Give the prompt as --prompt TEXT or as --prompt-ids 1,2,3 (one of them).");
  if (f.threads > 0) torch::set_num_threads(f.threads);
  auto lm = train::load_causal_lm(f.model, f.options.seed);
  std::fprintf(stderr, "trainyard generate: %s\n", lm.description.c_str());
  std::vector<std::int64_t> prompt;
  if (!f.prompt_ids.empty()) {
    prompt = parse_ids(f.prompt_ids);
  } else {
    for (auto id : lm.tokenizer.encode(f.prompt)) prompt.push_back(id);
  }
  auto options = f.options;
  // Text needs ids the tokenizer can decode (a byte tokenizer's 256 for a folder without
  // tokenizer.json); working in ids, the model's whole vocabulary applies, as in transformers.
  if (!f.print_ids) options.vocab_limit = lm.tokenizer.vocab_size;
  if (lm.tokenizer.eos_id >= 0) options.eos_id = lm.tokenizer.eos_id;
  const auto out = models::generate(*lm.model, prompt, options);
  if (f.print_ids) {
    std::printf("%s\n", join_ids(out).c_str());
  } else {
    std::printf("%s%s\n",
                f.prompt_ids.empty() ? f.prompt.c_str() : lm.tokenizer.decode(prompt).c_str(),
                lm.tokenizer.decode(out).c_str());
  }
  return 0;
}

}  // namespace

void add_generate_command(CLI::App& app, int& exit_code) {
  static GenerateFlags f;  // CLI11 binds flags to storage that outlives parsing
  auto* c = app.add_subcommand(
      "generate",
      "Generate text from a causal-lm run (its newest checkpoint), a preset or a Hugging Face "
      "model folder, with a key/value cache.");
  c->add_option("--model", f.model,
                "A causal-lm run's folder (STORAGE/NAME, any storage URI), a "
                "GPT-NeoX preset, or a Hugging Face model folder")
      ->required();
  c->add_option("--prompt", f.prompt, "The text to continue");
  c->add_option("--prompt-ids", f.prompt_ids, "The prompt as token ids: 1,2,3");
  c->add_flag("--print-ids", f.print_ids, "Print the generated token ids (comma-separated)");
  c->add_option("--max-new-tokens", f.options.max_new_tokens)->capture_default_str();
  c->add_flag("--greedy", f.options.greedy, "Always take the most likely token");
  c->add_option("--temperature", f.options.temperature)->capture_default_str();
  c->add_option("--top-k", f.options.top_k, "Sample from the k most likely tokens (0: all)")
      ->capture_default_str();
  c->add_option("--top-p", f.options.top_p, "Sample from the smallest set of tokens reaching p")
      ->capture_default_str();
  c->add_option("--seed", f.options.seed, "Seed of the sampler (and of a preset's initialisation)")
      ->capture_default_str();
  c->add_option("--threads", f.threads, "Intra-op threads (0: LibTorch's default)");
  c->callback([&exit_code] { exit_code = run_generate(f); });
}

}  // namespace trainyard::cli
