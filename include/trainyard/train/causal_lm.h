// The seed's LLM fine-tuning job as a recipe: a causal LM (models/causal_lm.h: a preset, or a
// Hugging Face directory's config.json, any architecture make_causal_lm builds) trained on a text
// corpus prepared as the seed prepares tiny_shakespeare (data/text_lines.h), with
// FullyShardedDataParallel (one unit per transformer layer and per embedding, BACKWARD_PRE and
// forward prefetch, limit_all_gathers), optional activation checkpointing, bf16 mixed precision,
// AdamW, on the Trainer: sharded checkpoints every rank writes, resumable at another world size,
// and the seed's "Training result" table (epoch, step, train_loss). --strategy ddp runs
// DistributedDataParallel instead, to compare.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "trainyard/data/instruction_data.h"
#include "trainyard/fsdp/wrap_policy.h"
#include "trainyard/models/causal_lm.h"
#include "trainyard/models/hf_weights.h"
#include "trainyard/models/lora.h"
#include "trainyard/precision.h"
#include "trainyard/strategy.h"
#include "trainyard/train/result.h"
#include "trainyard/train/run_config.h"

namespace trainyard::train {

struct CausalLmOptions {
  RunConfig run{.name = "causal-lm", .num_to_keep = 1};
  ScalingConfig scaling;
  std::string model = "pythia-70m";  // a preset, or a folder holding config.json
  std::string data;                  // the corpus: a text file, or records (data_format)
  // text: one training line per line (seed 000); samsum, alpaca, jsonl: prompt/response records
  // fine-tuned as llama-recipes does (seed 002: data/instruction_data.h).
  data::DataFormat data_format = data::DataFormat::kText;
  std::string prompt_template;  // jsonl: "{field}" placeholders
  std::string response_field;   // jsonl
  enum class Batching {
    kPacking,  // records end to end, cut into seq_len rows: every position a real token
    kPadding,  // length-grouped batches, each padded to its longest record
  };
  Batching batching = Batching::kPacking;  // records only; text lines are padded to seq_len
  std::string val_data;     // validation file of the same format; empty: none or val_fraction
  double val_fraction = 0;  // (0, 1): that share of --data held out for validation
  // tokenizer.json; empty: the model folder's, else bytes as tokens (ids 0-255).
  std::string tokenizer;
  Strategy strategy = Strategy::kFullShard;  // one of kTrainingStrategies
  // bf16-mixed: FSDP's MixedPrecision (bf16 gathers, fp32 shards and reductions) or DDP's
  // autocast; pure-bf16 (FSDP only): bf16 shards, gradients, reductions and AdamW state.
  Precision precision = Precision::kBf16Mixed;
  bool activation_checkpointing = false;
  std::int64_t seq_len = 256;
  std::int64_t batch_size = 14;  // sequences per rank and step
  int epochs = 1;
  // AdamW's learning rate; unset: the seed's 2e-5 for text, llama-recipes' 1e-4 for records.
  std::optional<double> lr;
  // StepLR: the learning rate is multiplied by gamma after every epoch; unset: 1 for text,
  // llama-recipes' 0.85 for records.
  std::optional<double> gamma;
  double eps = 1e-8;
  double weight_decay = 0.01;  // AdamW's decoupled decay, torch's default
  // Micro-batches of batch_size per optimizer step; gradients are synchronised on the last only.
  std::int64_t gradient_accumulation_steps = 1;
  // --peft lora: LoRA adapters on lora->targets, the base frozen (no gradient, no optimizer
  // state; under bf16-mixed its FSDP shards held in bf16); checkpoints hold the adapters only.
  std::optional<models::LoraOptions> lora;
  std::int64_t max_steps = -1;  // stop after this many steps of the run; -1: all epochs
  std::uint64_t seed = 0;       // initialisation (of a random model) and shuffling
  bool progress = true;         // a progress bar on rank 0 when the output is a terminal

  bool records() const { return data_format != data::DataFormat::kText; }
  double effective_lr() const { return lr.value_or(records() ? 1e-4 : 2e-5); }
  double effective_gamma() const { return gamma.value_or(records() ? 0.85 : 1.0); }

  // Throws InvalidArgumentError naming the first bad flag.
  void validate() const;
};

// How text becomes token ids and back: a tokenizer.json, or bytes as tokens (ids 0-255).
struct TextTokenizer {
  std::string id;  // "bytes", or the tokenizer.json's path: recorded in the run's config.json
  std::string cache_key;  // names it in the token cache: the file's SHA-256 (Note [Token cache])
  std::function<std::vector<std::int32_t>(std::string_view)> encode;        // with special tokens
  std::function<std::vector<std::int32_t>(std::string_view)> encode_plain;  // without
  std::function<std::string(const std::vector<std::int64_t>&)> decode;
  std::int32_t pad_id = 0;
  std::int64_t eos_id = -1;  // -1: none
  std::int64_t bos_id = -1;  // -1: none
  std::int64_t vocab_size = 0;
  std::size_t longest_token_bytes = 0;  // hf::Tokenizer::longest_token_bytes; 0: unknown
};
// The tokenizer `id` names ("bytes" or a tokenizer.json path).
TextTokenizer load_text_tokenizer(const std::string& id);

// A causal LM for one process (generation, export) and its tokenizer, from
//  - a causal-lm run's folder (<storage>/<name>, any storage URI): its config.json's model and
//    tokenizer, the weights of its newest complete checkpoint;
//  - a preset: initialised from `seed` as the recipe initialises it (the model before training);
//  - a Hugging Face folder: config.json, and tokenizer.json when there is one.
struct LoadedLm {
  models::CausalLm model{nullptr};
  TextTokenizer tokenizer;
  std::string description;  // what was loaded, for a log line
  // A LoRA run's base as it is now (JSON text; Note [A LoRA checkpoint's base] in
  // causal_lm_source.cpp), which a checkpoint's adapters must have been trained on; else empty.
  std::string lora_base;
};
LoadedLm load_causal_lm(const std::string& model_or_run, std::uint64_t seed = 0);

// Writes checkpoint RUN/checkpoint_NNNNNN of a causal-lm run as a Hugging Face model folder
// (config.json, safetensors weights, the run's tokenizer.json when it had one) in `out_dir`;
// returns what it exported. Throws InvalidArgumentError, writing nothing, when `out_dir` is an
// existing file, and unless options.overwrite (--force) when it is a run's folder (config.json
// with a recipe, or checkpoints) or holds files already, which the export would write over.
std::string export_checkpoint(const std::string& checkpoint_uri,
                              const std::string& out_dir,
                              const models::ExportOptions& options = {});

// FSDP's units for a causal LM, the seed's transformer wrapping policy: one per transformer layer
// (model->is_layer) and one per module model->unit_names() names (the untied embeddings).
fsdp::WrapPolicy causal_lm_wrap_policy(const models::CausalLm& model);

// Runs one rank of the job on the Trainer; the environment contract must be present. The result
// holds epoch, step and train_loss (the table's rows), tokens/s and every rank's peak RSS.
Result run_causal_lm_rank(const CausalLmOptions& options);

}  // namespace trainyard::train
