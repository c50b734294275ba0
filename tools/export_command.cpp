#include "tools/export_command.h"

#include <cstdio>

#include "trainyard/error.h"
#include "trainyard/train/causal_lm.h"

namespace trainyard::cli {

void add_export_command(CLI::App& app, int& exit_code) {
  static std::string checkpoint, out;  // CLI11 binds flags to storage that outlives parsing
  static double max_shard_gb = 5;
  static bool bf16 = false;
  static bool force = false;
  static bool adapter_only = false;
  auto* c = app.add_subcommand(
      "export",
      "Write a causal-lm run's checkpoint as a Hugging Face model folder (config.json, "
      "safetensors weights, tokenizer.json), streamed one tensor at a time.");
  c->add_option("--checkpoint", checkpoint,
                "The checkpoint: STORAGE/NAME/checkpoint_NNNNNN (a directory, file:// or s3://)")
      ->required();
  c->add_option("--out", out, "The folder to write")->required();
  c->add_option("--max-shard-size", max_shard_gb,
                "GB (1e9 bytes) per safetensors file before the weights are sharded with an index")
      ->capture_default_str();
  c->add_flag("--bf16", bf16, "Write bfloat16 weights (default: float32, as trained)");
  c->add_flag("--adapter-only", adapter_only,
              "A LoRA run: write its adapters alone in PEFT's layout (adapter_config.json, "
              "adapter_model.safetensors) instead of the merged model");
  c->add_flag("--force", force,
              "Write into --out even when it holds files already or is a run's folder");
  c->callback([&exit_code] {
    TY_CHECK(max_shard_gb > 0, "--max-shard-size must be > 0 GB, got ", max_shard_gb, ".");
    const auto what =
        train::export_checkpoint(checkpoint, out,
                                 {.max_shard_bytes = static_cast<std::uint64_t>(max_shard_gb * 1e9),
                                  .bf16 = bf16,
                                  .overwrite = force,
                                  .adapter_only = adapter_only});
    std::printf("Exported %s to %s\n", what.c_str(), out.c_str());
    exit_code = 0;
  });
}

}  // namespace trainyard::cli
