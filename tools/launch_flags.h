// The launcher's flags, declared once for every command that launches ranks (`trainyard run`, a
// recipe run bare): each flag beside its environment variable (env.h), every time value parsed by
// parse_seconds straight into elastic::LaunchOptions' durations, the one holder of a launch
// setting. What needs a rendezvous to mean anything (--nnodes MIN:MAX, --rdzv-*) is kept as given
// in LaunchFlags, for run_command.cpp to resolve.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "trainyard/elastic/launcher.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace trainyard::cli {

// A time flag: a decimal number of seconds in [min, max].
struct SecondsFlag {
  std::string names;        // CLI11's, e.g. "--hang-timeout,--hang_timeout"
  std::string description;  // --help's text; the default is shown after it
  double min = 0;
  double max = 1e6;
  const char* env = nullptr;  // read when the flag is not given
  // Read when neither the flag nor `env` is given (at most one per command). A bad value is an
  // error when the command is parsed, not when it is declared.
  const char* fallback_env = nullptr;
  std::string hint;  // ends the error message
};
// Declares `flag` on `cmd`, writing into `target`, whose value is the default. A bad value is an
// error naming the flag, the variable it may have come from, the range and the hint.
CLI::Option* add_seconds_option(CLI::App& cmd,
                                std::chrono::milliseconds& target,
                                const SecondsFlag& flag);

// What the launcher flags fill.
struct LaunchFlags {
  elastic::LaunchOptions options;  // every flag with a direct meaning: counts, addresses, times
  std::string nnodes = "1";        // N or MIN:MAX
  std::string rdzv_backend = "static";
  std::string rdzv_endpoint;
  std::string rdzv_conf;
  std::string local_addr;
  bool standalone = false;
  int metrics_port = -1;  // -1: no metrics endpoint; 0: a free port
  std::string metrics_bind = "127.0.0.1";
};

// Every flag of `trainyard run`: torchrun's names with their PET_* variables, and trainyard's.
void add_launch_flags(CLI::App& cmd, LaunchFlags& flags);
// The restart policy alone (--max-restarts, --restart-backoff, --restart-backoff-max,
// --hang-timeout), as `trainyard run` declares it: for a recipe run bare, which launches its own
// ranks (its --workers is the number).
void add_restart_flags(CLI::App& cmd, elastic::LaunchOptions& options);

// --nproc-per-node as torchrun takes it (and Kubeflow Trainer v2 sets PET_NPROC_PER_NODE on GPU
// pods): a whole number, or auto (the visible GPUs when there are any, else the usable CPUs), cpu
// (the usable CPUs) or gpu (the visible GPUs; an error without any). Replaces a word in `value`
// by its number; returns "" when valid, else what is wrong (after the flag's or variable's name).
std::string resolve_nproc_per_node(std::string& value);

// The int the whole of `text` spells in decimal; nullopt otherwise.
std::optional<int> parse_whole_number(std::string_view text);

// --nnodes: "N" or "MIN:MAX" with 1 <= MIN <= MAX; nullopt otherwise.
std::optional<std::pair<int, int>> parse_nnodes(const std::string& text);

}  // namespace trainyard::cli
