// trainyard: one binary, one subcommand per layer (run: the launcher; train: the recipes).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tools/bench_command.h"
#include "tools/cluster_commands.h"
#include "tools/daemon_commands.h"
#include "tools/export_command.h"
#include "tools/generate_command.h"
#include "tools/plan_command.h"
#include "tools/run_command.h"
#include "tools/tokenize_command.h"
#include "tools/train_command.h"
#include "trainyard/comm/build_info.h"
#include "trainyard/env.h"
#include "trainyard/error.h"

namespace {

// An App's final callback (App::callback's), which CLI11 keeps protected, through a member
// pointer taken in a subclass.
struct AppCallbacks : CLI::App {
  static constexpr auto kFinal = &AppCallbacks::final_callback_;
};

// kParseOnlyEnv: the commands' callbacks taken out, so parsing checks the flags and runs nothing.
// They are kept, never called, until exit: each owns (through a shared_ptr it captures) the flags
// that parsing writes into, which destroying it freed (a use after free that crashed `submit`
// with a long command).
void drop_callbacks(CLI::App& app, std::vector<std::function<void()>>& kept) {
  kept.push_back(std::exchange(app.*AppCallbacks::kFinal, {}));
  for (auto* sub : app.get_subcommands([](CLI::App*) { return true; })) drop_callbacks(*sub, kept);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"trainyard: distributed training for LibTorch", "trainyard"};
  app.require_subcommand(1);
  app.set_version_flag("--version", [] {
    return "trainyard 0.1.0\n" + trainyard::comm::describe(trainyard::comm::build_info());
  });
  int exit_code = 0;
  trainyard::cli::add_run_command(app, exit_code);
  trainyard::cli::add_train_command(app, std::vector<std::string>(argv, argv + argc), exit_code);
  trainyard::cli::add_generate_command(app, exit_code);
  trainyard::cli::add_export_command(app, exit_code);
  trainyard::cli::add_plan_command(app, exit_code);
  trainyard::cli::add_tokenize_command(app, exit_code);
  trainyard::cli::add_bench_command(app, exit_code);
  trainyard::cli::add_daemon_commands(app, exit_code);
  trainyard::cli::add_cluster_commands(app, exit_code);
  const char* parse_only = std::getenv(trainyard::kParseOnlyEnv);
  std::vector<std::function<void()>> dropped;
  if (parse_only != nullptr && std::string(parse_only) == "1") drop_callbacks(app, dropped);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const trainyard::Error& e) {
    std::fprintf(stderr, "trainyard: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainyard: unexpected error: %s\n", e.what());
    return 1;
  }
  return exit_code;
}
