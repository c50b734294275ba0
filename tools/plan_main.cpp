// trainyard-plan: `trainyard plan` on its own, without LibTorch (it links only trainyard_core), for
// machines that plan rather than train and for bench/plan_vs_measured.sh.
//   build/trainyard-plan plan --model dolly-v2-7b --gpus 8 --gpu-mem 24GiB
#include <CLI/CLI.hpp>

#include <cstdio>

#include "tools/plan_command.h"
#include "trainyard/error.h"

int main(int argc, char** argv) {
  CLI::App app{"trainyard's memory planner", "trainyard-plan"};
  app.require_subcommand(1);
  int exit_code = 0;
  trainyard::cli::add_plan_command(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const trainyard::Error& e) {
    std::fprintf(stderr, "trainyard-plan: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainyard-plan: unexpected error: %s\n", e.what());
    return 1;
  }
  return exit_code;
}
