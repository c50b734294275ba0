// A run's outcome: written by rank 0 as <run>/result.json and printed as the seeds' "Training
// result" table (Ray Train's layout: checkpoint_dir_name, time_this_iter_s, time_total_s,
// training_iteration, then the recipe's metrics in the order it gives them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainyard::train {

struct Result {
  // One metric: in result.json always; in the table when `in_table`, with `decimals` digits after
  // the point (0: shown as an integer).
  struct Metric {
    std::string key;
    double value = 0;
    int decimals = 4;
    bool in_table = true;
  };

  std::string checkpoint_dir_name;  // the newest checkpoint of the run; empty: none
  double time_this_iter_s = 0;
  double time_total_s = 0;
  int training_iteration = 1;
  std::vector<Metric> metrics;
  std::string config_json = "{}";  // the run's configuration (config.json), as JSON text

  // The value of `key`; throws InvalidArgumentError when the result has no such metric.
  double metric(const std::string& key) const;
};

// result.json's text.
std::string result_json(const Result& result);

// Prints the "Training result" table of the run's result.json (`run_uri` is <storage>/<name>).
// Throws Error when there is no result (the job did not finish), CorruptDataError when it is not
// valid JSON.
void print_training_result(const std::string& run_uri);

}  // namespace trainyard::train
