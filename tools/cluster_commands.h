// The cluster's client commands: `trainyard status`, `submit`, `jobs`, `logs`, `stop`, `delete`.
// They find the head through --address or TRAINYARD_ADDRESS and the token through --token-file or
// TRAINYARD_TOKEN, and speak the head's Ray-compatible Jobs API (cluster::HeadClient).
#pragma once

#include <CLI/CLI.hpp>

namespace trainyard::cli {

// Adds the client subcommands; when one runs, its exit status goes to *exit_code (`submit`: 0
// only when the job SUCCEEDED, unless --no-wait). Errors throw trainyard::Error, which main()
// reports.
void add_cluster_commands(CLI::App& app, int& exit_code);

}  // namespace trainyard::cli
