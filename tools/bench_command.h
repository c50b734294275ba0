// `trainyard bench collectives`: run as every rank of a job under `trainyard run`, a bus-bandwidth
// sweep of all_reduce, all_gather, reduce_scatter and broadcast through the process group init()
// builds (shared memory on one host, Gloo otherwise), every result checked, printed by rank 0 in
// nccl-tests' layout (comm/collective_bench.h); and `trainyard bench scaling`
// (tools/bench_scaling_command.h).
#pragma once

#include <CLI/CLI.hpp>

namespace trainyard::cli {

// Adds the `bench` subcommand with its `collectives` and `scaling` subcommands; when one runs, its
// exit status goes to *exit_code (1 when an output element was wrong).
void add_bench_command(CLI::App& app, int& exit_code);

}  // namespace trainyard::cli
