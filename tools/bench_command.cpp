#include "tools/bench_command.h"

#include <cstdio>
#include <string>

#include "tools/bench_scaling_command.h"
#include "trainyard/comm/collective_bench.h"
#include "trainyard/comm/dist_env.h"
#include "trainyard/comm/process_group.h"
#include "trainyard/error.h"

namespace trainyard::cli {
namespace {

using comm::CollectiveBenchOptions;

struct CollectivesFlags {
  std::string ops = "all_reduce,all_gather,reduce_scatter,broadcast";
  std::string min_bytes = "1K";
  std::string max_bytes = "64M";
  int iters = CollectiveBenchOptions::kDefaultIters;
  int warmup = CollectiveBenchOptions::kDefaultWarmupIters;
  std::string buffer = "ordinary";
  int check = 1;
};

// The flags as options, validated before any rank joins, so a typo fails at once on every rank.
CollectiveBenchOptions to_options(const CollectivesFlags& f) {
  CollectiveBenchOptions o{
      .ops = comm::parse_collective_ops(f.ops),
      .min_bytes = comm::parse_bench_bytes(f.min_bytes, "--min-bytes"),
      .max_bytes = comm::parse_bench_bytes(f.max_bytes, "--max-bytes"),
      .warmup_iters = f.warmup,
      .iters = f.iters,
      .buffer = f.buffer == "shared" ? comm::BenchBuffer::kShared : comm::BenchBuffer::kOrdinary,
      .check = f.check != 0,
  };
  o.validate();
  return o;
}

int run_collectives(const CollectivesFlags& f) {
  // A bare start has no peers to measure: say how to launch it rather than bench one rank.
  TY_CHECK(dist_env_present(),
           "trainyard bench collectives runs as every rank of a job, but RANK and WORLD_SIZE are "
           "not set. HINT: trainyard run --nproc-per-node 2 -- trainyard bench collectives (with "
           "--nnodes, --node-rank and --master-addr to span nodes).");
  const CollectiveBenchOptions options = to_options(f);
  auto dist = init();
  const auto rows = comm::run_collective_bench(dist->process_group(), options,
                                               dist->rank() == 0 ? stdout : nullptr);
  // Every rank sees the same rows (wrong elements are summed over ranks), so every rank fails.
  const auto wrong = comm::total_wrong(rows);
  if (wrong > 0) {
    std::fprintf(stderr,
                 "trainyard bench collectives: rank %d/%d: %lld output elements were wrong through "
                 "the %s process group (the #wrong column names the ops and sizes).\n",
                 dist->rank(), dist->world_size(), static_cast<long long>(wrong),
                 dist->process_group()->getBackendName().c_str());
    return 1;
  }
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, int& exit_code) {
  static CollectivesFlags f;  // CLI11 binds flags to storage that outlives parsing
  auto* bench = app.add_subcommand("bench", "Measure trainyard's building blocks.");
  bench->require_subcommand(1);
  auto* c = bench->add_subcommand(
      "collectives",
      "Run under `trainyard run`, as every rank: bus bandwidth of all_reduce, all_gather, "
      "reduce_scatter and broadcast over a size sweep through the job's process group (shared "
      "memory on one host, Gloo across hosts; TRAINYARD_SHM=0 forces Gloo), every output element "
      "checked, printed by rank 0 in nccl-tests' format. Exits 1 when an element was wrong.");
  c->add_option("--ops", f.ops,
                "Comma-separated collectives, run in this order: all_reduce, all_gather, "
                "reduce_scatter, broadcast")
      ->capture_default_str();
  c->add_option("--min-bytes,-b", f.min_bytes,
                "Smallest size: the whole tensor in bytes (W x the per-rank slot for all_gather "
                "and reduce_scatter); K, M, G are powers of 1024")
      ->capture_default_str();
  c->add_option("--max-bytes,-e", f.max_bytes, "Largest size, as --min-bytes; sizes double")
      ->capture_default_str();
  c->add_option("--iters,-n", f.iters, "Timed calls per size")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  c->add_option("--warmup,-w", f.warmup, "Untimed calls before each size's timed ones")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  c->add_option("--buffer", f.buffer,
                "ordinary: plain tensors; shared: allocate_collective_buffer (in place in shared "
                "memory under the shared-memory group, as DDP's buckets and FSDP's parameters)")
      ->capture_default_str()
      ->check(CLI::IsMember({"ordinary", "shared"}));
  c->add_option("--check,-c", f.check, "1: check every output element; 0: time only")
      ->capture_default_str()
      ->check(CLI::Range(0, 1));
  c->callback([&exit_code] { exit_code = run_collectives(f); });
  add_bench_scaling_command(*bench, exit_code);
}

}  // namespace trainyard::cli
