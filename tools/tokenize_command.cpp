#include "tools/tokenize_command.h"

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "trainyard/error.h"
#include "trainyard/hf/tokenize_lines.h"
#include "trainyard/hf/tokenizer.h"
#include "trainyard/models/causal_lm_config.h"

namespace trainyard::cli {
namespace {

namespace fs = std::filesystem;

struct TokenizeOptions {
  std::string model;    // a folder, a tokenizer.json, a preset or "bytes"
  bool decode = false;  // ids -> text instead of text -> ids
  // Encode: the post-processor's special tokens (Llama's BOS); decode: keep special tokens.
  bool special_tokens = true;
  int threads = 0;  // encoding threads; 0: every usable CPU
};

// --model: a folder (its tokenizer.json, or byte-level ids without one), a tokenizer.json file,
// "bytes", or a preset name (presets ship no tokenizer: byte-level ids).
hf::Tokenizer load(const std::string& model) {
  std::error_code ec;
  if (fs::is_directory(model, ec)) return hf::Tokenizer::from_directory(model);
  if (fs::is_regular_file(model, ec)) return hf::Tokenizer::from_file(model);
  const auto presets = models::CausalLmConfig::preset_names();
  if (model == "bytes" || std::find(presets.begin(), presets.end(), model) != presets.end())
    return hf::Tokenizer::byte_level();
  std::string known;
  for (const auto& p : presets) known += ", " + p;
  throw InvalidArgumentError(detail::concat(
      "--model ", model, " is neither a folder, a tokenizer.json, \"bytes\" nor a preset", known,
      ". HINT: give the Hugging Face model folder that holds tokenizer.json."));
}

}  // namespace

void add_tokenize_command(CLI::App& app, int& exit_code) {
  static TokenizeOptions o;  // CLI11 binds flags to storage that outlives parsing
  auto* cmd = app.add_subcommand(
      "tokenize",
      "Read lines of text on stdin and write each line's token ids, separated by spaces, one line "
      "per line (the ids Hugging Face's tokenizers gives; an empty line gives an empty line). "
      "With --decode, read such lines of ids (spaces or commas between them) and write each "
      "line's text; ids the tokenizer does not know are dropped, and bytes that are not UTF-8 "
      "become U+FFFD, as in Hugging Face's decode.");
  cmd->add_option("--model", o.model,
                  "A model folder (its tokenizer.json; byte-level ids 0-255 when it has none), a "
                  "tokenizer.json, \"bytes\", or a preset (byte-level ids)")
      ->required();
  cmd->add_flag("--decode", o.decode, "Ids to text instead of text to ids");
  cmd->add_flag("--add-special-tokens,!--no-special-tokens", o.special_tokens,
                "Encoding: --add-special-tokens (the default, as Hugging Face's encode) adds the "
                "special tokens the tokenizer's post-processor puts around each line (BOS <s> for "
                "Llama 2 and Mistral, <|begin_of_text|> for Llama 3; none for GPT-NeoX and "
                "Qwen2); --no-special-tokens gives the text's ids alone. Decoding: "
                "--no-special-tokens leaves out special tokens such as <s> and <|endoftext|>");
  cmd->add_option("--threads", o.threads, "Encoding threads (0: every usable CPU)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->callback([&exit_code] {
    std::ios::sync_with_stdio(false);
    const hf::Tokenizer tok = load(o.model);
    if (o.decode)
      hf::decode_lines(tok, std::cin, std::cout, /*skip_special_tokens=*/!o.special_tokens);
    else
      hf::encode_lines(tok, std::cin, std::cout,
                       {.add_special_tokens = o.special_tokens, .threads = o.threads});
    exit_code = 0;
  });
}

}  // namespace trainyard::cli
