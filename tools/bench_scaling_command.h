// `trainyard bench scaling`: runs a recipe at a list of world sizes (local ranks through
// `trainyard run --standalone`), reads each run's result.json, prints the table of epoch time,
// throughput, measured and predicted weak-scaling efficiency (plan/scaling_model.h), and writes
// scaling.json with the epoch-time and throughput charts as SVG and PNG (scaling_chart.h).
#pragma once

#include <CLI/CLI.hpp>

namespace trainyard::cli {

// Adds `scaling` under the `bench` subcommand; its exit status goes to *exit_code.
void add_bench_scaling_command(CLI::App& bench, int& exit_code);

}  // namespace trainyard::cli
