#pragma once

#include <CLI/CLI.hpp>

namespace trainyard::cli {

// `trainyard generate`: text from a causal-lm run's newest checkpoint, a preset or a Hugging Face
// model folder, greedy or sampled, decoded with a key/value cache.
void add_generate_command(CLI::App& app, int& exit_code);

}  // namespace trainyard::cli
