#include "tools/plan_command.h"

#include <cstdio>
#include <optional>
#include <string>

#include "trainyard/error.h"
#include "trainyard/plan/memory_plan.h"

namespace trainyard::cli {
namespace {

// The flags as given, parsed and checked when the command runs, so each error names its flag.
struct PlanFlags {
  std::string model, params, precision = "bf16-mixed", gpu_mem, runtime_mem, format = "table";
  int gpus = 1, gpus_per_node = 0;
  std::optional<int> nodes;             // unset: one node
  std::optional<std::int64_t> seq_len;  // unset: the model's max_position_embeddings, else 2048
  std::int64_t batch_size = 1;
  bool activation_checkpointing = false, decimal = false, cpu = false;
  double headroom = 0.10;
  std::string peft;  // "lora" or empty
  models::LoraOptions lora;
};

plan::PlanOptions to_options(const PlanFlags& f) {
  plan::PlanOptions o;
  TY_CHECK(!f.model.empty() || !f.params.empty(),
           "trainyard plan needs --model (a preset, a config.json or its directory) or --params "
           "(a parameter count such as 7.5e9).");
  if (!f.model.empty()) o.model = plan::resolve_model(f.model, "--model");
  if (!f.params.empty()) o.parameter_count = plan::parse_count(f.params, "--params");
  TY_CHECK(!o.model || o.parameter_count == 0 || o.parameter_count == o.model->parameter_count(),
           "--params (", o.parameter_count, ") disagrees with --model ", f.model, " (",
           o.model ? o.model->parameter_count() : 0, " parameters). HINT: give one of them.");
  o.precision = parse_precision(f.precision, "--precision");
  TY_CHECK(f.gpus >= 1, "--gpus must be >= 1, got ", f.gpus, ".");
  TY_CHECK(f.gpus_per_node >= 0, "--gpus-per-node must be >= 1, got ", f.gpus_per_node, ".");
  o.world_size = f.gpus;
  o.gpus_per_node = f.gpus_per_node;
  if (f.nodes) {
    const int nodes = *f.nodes;
    TY_CHECK(nodes >= 1, "--nodes must be >= 1, got ", nodes, ". HINT: leave it out for one node.");
    TY_CHECK(f.gpus % nodes == 0, "--nodes (", nodes, ") must divide --gpus (", f.gpus,
             "): every node runs the same number of ranks.");
    TY_CHECK(f.gpus_per_node == 0 || f.gpus_per_node * nodes == f.gpus, "--nodes ", nodes,
             " x --gpus-per-node ", f.gpus_per_node, " is not --gpus ", f.gpus, ".");
    o.gpus_per_node = f.gpus / nodes;
  }
  TY_CHECK(!f.seq_len || *f.seq_len >= 2, "--seq-len must be >= 2 (a token and the next one to ",
           "predict), got ", f.seq_len.value_or(0), ". HINT: leave it out for the model's ",
           "max_position_embeddings.");
  o.seq_len = f.seq_len ? *f.seq_len : o.model ? o.model->max_position_embeddings() : 2048;
  o.micro_batch = f.batch_size;
  o.activation_checkpointing = f.activation_checkpointing;
  if (!f.gpu_mem.empty()) {
    o.device_memory_bytes = plan::parse_byte_size(f.gpu_mem, "--gpu-mem");
    TY_CHECK(o.device_memory_bytes > 0, "--gpu-mem is '", f.gpu_mem,
             "'; a device needs some memory (e.g. 24GiB, 80GB).");
  }
  o.headroom = f.headroom;
  o.runtime_bytes = !f.runtime_mem.empty() ? plan::parse_byte_size(f.runtime_mem, "--runtime-mem")
                    : f.cpu                ? plan::kCpuRuntimeBytes
                                           : 0;
  o.cpu_ranks = f.cpu;
  if (f.peft == "lora") o.lora = f.lora;
  o.validate();
  return o;
}

// One line per strategy (the table's rows, then NO_SHARD), bytes, for scripts.
void print_csv(const plan::PlanOptions& o) {
  std::printf(
      "strategy,params,grads,optimizer,activations,runtime,total,persistent,paper_total,fits,"
      "peak_at\n");
  for (auto s : plan::kPlannedStrategies) {
    const auto r = plan::plan_strategy(o, s);
    std::printf("%s,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%s,%s\n",
                std::string(display_name(s)).c_str(), r.params, r.grads, r.optimizer, r.activations,
                r.runtime, r.total(), r.persistent, r.paper_total(), r.fits ? "yes" : "no",
                r.peak_phase.c_str());
  }
}

}  // namespace

void add_plan_command(CLI::App& app, int& exit_code) {
  static PlanFlags f;  // CLI11 binds flags to storage that outlives parsing
  auto* cmd = app.add_subcommand(
      "plan",
      "Per-device memory of parameters, gradients, optimizer state and activations under DDP, "
      "ZeRO-1, SHARD_GRAD_OP, HYBRID_SHARD and FULL_SHARD, and which fits the devices. E.g.\n"
      "  trainyard plan --model dolly-v2-7b --gpus 8 --gpu-mem 24GiB\n"
      "  trainyard plan --params 7.5e9 --gpus 64 --gpu-mem 80GiB");
  cmd->add_option(
      "--model", f.model,
      "A preset (" +
          [] {
            std::string s;
            for (const auto& n : models::CausalLmConfig::preset_names())
              s += (s.empty() ? "" : ", ") + n;
            return s;
          }() +
          "), a Hugging Face config.json (GPT-NeoX, Llama, Mistral, Qwen2), or a directory holding "
          "one");
  cmd->add_option("--params", f.params,
                  "Parameter count instead of a model (7.5e9, 6.9B, 410M): model states only");
  cmd->add_option("--gpus", f.gpus, "Devices (ranks) in the job, over all nodes")
      ->capture_default_str();
  cmd->add_option("--nodes", f.nodes, "Nodes the devices are spread over (HYBRID_SHARD)");
  cmd->add_option("--gpus-per-node", f.gpus_per_node,
                  "Devices per node: HYBRID_SHARD shards within a node (default: --gpus / "
                  "--nodes, or all on one node)");
  cmd->add_option("--gpu-mem", f.gpu_mem, "Memory per device: 24GiB, 80GB, 40000MiB, bytes");
  cmd->add_option("--headroom", f.headroom,
                  "Share of --gpu-mem kept free for fragmentation and communication buffers")
      ->capture_default_str();
  cmd->add_option("--seq-len", f.seq_len,
                  "Tokens per sequence (default: the model's max_position_embeddings, else 2048)");
  cmd->add_option("--batch-size", f.batch_size, "Micro-batch: sequences per device per forward")
      ->capture_default_str();
  cmd->add_option("--precision", f.precision,
                  "fp32, or bf16-mixed (bf16 compute, fp32 master weights and Adam state); "
                  "pure-bf16 is not planned")
      ->capture_default_str();
  cmd->add_flag("--activation-checkpointing", f.activation_checkpointing,
                "Recompute each layer in backward, keeping only its input");
  cmd->add_option("--runtime-mem", f.runtime_mem,
                  "Per-process memory outside the model (runtime, allocator, CUDA context) to add "
                  "to each device (default 0; --cpu: what trainyard's CPU ranks measured)");
  cmd->add_flag("--cpu", f.cpu,
                "The devices are CPU ranks of trainyard's engine on one machine: plan their peak "
                "RSS (caching allocator pools, shared gradient buckets) and add the measured "
                "runtime overhead");
  cmd->add_option("--peft", f.peft, "lora: also count LoRA's adapters and a frozen base")
      ->check(CLI::IsMember({"lora"}));
  cmd->add_option("--lora-r", f.lora.r, "LoRA rank")->capture_default_str();
  cmd->add_option("--lora-targets", f.lora.targets, "Linear layers LoRA adapts, or all-linear")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_flag("--decimal", f.decimal, "Sizes in GB (1e9 bytes) instead of GiB (2^30)");
  cmd->add_option("--format", f.format, "table, or csv (bytes, one line per strategy)")
      ->capture_default_str();
  cmd->callback([&exit_code] {
    const auto options = to_options(f);
    TY_CHECK(f.format == "table" || f.format == "csv", "--format is '", f.format,
             "'; expected table or csv.");
    if (f.format == "csv") {
      print_csv(options);
    } else {
      std::printf("%s", plan::format_plan(plan::plan_memory(options), f.decimal).c_str());
    }
    exit_code = 0;
  });
}

}  // namespace trainyard::cli
