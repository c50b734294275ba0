// The cluster's daemons: `trainyard head` (the REST API, the job store, the scheduler; by default
// it also runs ranks, as the seeds' Ray head does) and `trainyard worker`. Each runs until
// SIGTERM or SIGINT, then stops in order (a worker that leaves this way is not a failure).
#pragma once

#include <CLI/CLI.hpp>

namespace trainyard::cli {

void add_daemon_commands(CLI::App& app, int& exit_code);

}  // namespace trainyard::cli
