// `trainyard tokenize --model M [--decode]`: lines of text to lines of token ids and back, with
// the model's tokenizer.json (hf::Tokenizer) or byte-level ids when it has none; for scripts.
#pragma once

#include <CLI/CLI.hpp>

namespace trainyard::cli {

// Adds the `tokenize` subcommand; when it runs, its exit status goes to *exit_code.
void add_tokenize_command(CLI::App& app, int& exit_code);

}  // namespace trainyard::cli
