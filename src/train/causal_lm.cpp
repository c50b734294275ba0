#include "trainyard/train/causal_lm.h"

#include <ATen/autocast_mode.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <random>

#include "train/causal_lm_source.h"
#include "trainyard/blas_core.h"
#include "trainyard/checkpoint/checkpointer.h"
#include "trainyard/checkpoint/torch_state.h"
#include "trainyard/comm/process_group.h"
#include "trainyard/cpu_count.h"
#include "trainyard/data/batch_loader.h"
#include "trainyard/data/distributed_sampler.h"
#include "trainyard/data/instruction_data.h"
#include "trainyard/data/text_lines.h"
#include "trainyard/ddp/distributed_data_parallel.h"
#include "trainyard/error.h"
#include "trainyard/fsdp/fully_sharded_data_parallel.h"
#include "trainyard/fsdp/state_dict.h"
#include "trainyard/heartbeat.h"
#include "trainyard/hf/weight_reader.h"
#include "trainyard/log.h"
#include "trainyard/models/hf_weights.h"
#include "trainyard/nn/autocast.h"
#include "trainyard/optim/fused_adamw.h"
#include "trainyard/train/trainer.h"

namespace trainyard::train {
using Clock = std::chrono::steady_clock;

namespace {

nlohmann::ordered_json config_json(const CausalLmOptions& o,
                                   const models::CausalLmConfig& config,
                                   const TextTokenizer& tokenizer,
                                   const nlohmann::ordered_json& data_summary,
                                   int world_size,
                                   int threads) {
  nlohmann::ordered_json j = {{"recipe", "causal-lm"},
                              {"model", o.model},
                              {"model_type", config.model_type()},
                              {"parameters", config.parameter_count()}};
  j.update(data_summary);
  j.update(
      nlohmann::ordered_json{{"tokenizer", tokenizer.id},
                             {"strategy", to_string(o.strategy)},
                             {"precision", to_string(o.precision)},
                             {"activation_checkpointing", o.activation_checkpointing},
                             {"world_size", world_size},
                             {"threads_per_rank", threads},
                             {"blas_core", blas_core_name()},
                             {"seq_len", o.seq_len},
                             {"batch_size", o.batch_size},
                             {"epochs", o.epochs},
                             {"max_steps", o.max_steps},
                             {"optimizer", "AdamW (FusedAdamW)"},
                             {"lr", o.effective_lr()},
                             {"gamma", o.effective_gamma()},
                             {"gradient_accumulation_steps", o.gradient_accumulation_steps},
                             {"peft", o.lora ? nlohmann::ordered_json{{"type", "lora"},
                                                                      {"r", o.lora->r},
                                                                      {"alpha", o.lora->alpha},
                                                                      {"dropout", o.lora->dropout},
                                                                      {"targets", o.lora->targets}}
                                             : nlohmann::ordered_json(nullptr)},
                             {"eps", o.eps},
                             {"weight_decay", o.weight_decay},
                             {"seed", o.seed},
                             {"storage", o.run.storage},
                             {"name", o.run.name},
                             {"checkpoint_every", o.run.checkpoint_every},
                             {"num_to_keep", o.run.num_to_keep}});
  return j;
}

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024.0;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// --- phase 1: the model's shape, the tokenizer and the data ------------------------------------

// Samples a training loop draws: text lines padded to seq_len, packed rows, or records grouped
// by length into padded batches.
struct LmDataset {
  std::int64_t samples = 0;  // lines, rows or records
  std::int64_t tokens = 0;   // real tokens in all of them
  // This rank's batches of `epoch` (sample indices each), from its `first_batch`-th on.
  std::function<std::vector<std::vector<std::int64_t>>(std::int64_t epoch,
                                                       std::int64_t first_batch)>
      batches;
  std::function<data::LmBatch(const std::vector<std::int64_t>&)> batch;  // any thread
};

struct RunData {
  ModelSource source;
  TextTokenizer tokenizer;
  LmDataset train, validation;     // validation.samples == 0: none
  nlohmann::ordered_json summary;  // what config.json records about the data
};

// Every rank's indices of the epoch from a DistributedSampler (PyTorch's), in batches.
std::function<std::vector<std::vector<std::int64_t>>(std::int64_t, std::int64_t)> sampled_batches(
    std::int64_t samples,
    std::int64_t batch_size,
    int world,
    int rank,
    std::uint64_t seed,
    bool shuffle) {
  return [=](std::int64_t epoch, std::int64_t first_batch) {
    data::DistributedSampler sampler({.dataset_size = samples,
                                      .num_replicas = world,
                                      .rank = rank,
                                      .shuffle = shuffle,
                                      .seed = seed});
    sampler.set_epoch(epoch);
    const auto indices = sampler.indices(first_batch * batch_size * world);
    std::vector<std::vector<std::int64_t>> out;
    for (std::size_t i = 0; i < indices.size(); i += static_cast<std::size_t>(batch_size))
      out.emplace_back(
          indices.begin() + static_cast<std::ptrdiff_t>(i),
          indices.begin() + static_cast<std::ptrdiff_t>(std::min(indices.size(), i + batch_size)));
    return out;
  };
}

// Text lines (seed 000): the corpus's lines, or the rows `keep` selects of them.
LmDataset text_dataset(std::shared_ptr<const data::TokenizedLines> lines,
                       std::vector<std::int64_t> keep,
                       const CausalLmOptions& o,
                       Trainer& trainer,
                       bool shuffle) {
  auto rows = std::make_shared<const std::vector<std::int64_t>>(std::move(keep));
  LmDataset d{.samples = static_cast<std::int64_t>(rows->size())};
  for (auto r : *rows) d.tokens += lines->lengths[static_cast<std::size_t>(r)];
  d.batches = sampled_batches(d.samples, o.batch_size, trainer.world_size(), trainer.rank(), o.seed,
                              shuffle);
  d.batch = [lines, rows](const std::vector<std::int64_t>& idx) {
    std::vector<std::int64_t> picked;
    for (auto i : idx) picked.push_back((*rows)[static_cast<std::size_t>(i)]);
    return data::causal_lm_batch(*lines, picked);
  };
  return d;
}

// Records (seed 002): packed rows or length-grouped padded batches.
LmDataset record_dataset(const std::vector<data::PromptResponse>& records,
                         const TextTokenizer& tokenizer,
                         const CausalLmOptions& o,
                         Trainer& trainer,
                         const std::string& what,
                         bool shuffle) {
  const bool packing = o.batching == CausalLmOptions::Batching::kPacking;
  const data::ExampleTokens tokens{
      .encode = tokenizer.encode_plain,
      .bos = tokenizer.bos_id >= 0 ? std::optional<std::int32_t>(tokenizer.bos_id) : std::nullopt,
      .eos = tokenizer.eos_id >= 0 ? std::optional<std::int32_t>(tokenizer.eos_id) : std::nullopt,
      .longest_token_bytes = tokenizer.longest_token_bytes};
  auto examples = data::tokenize_examples(records, tokens, o.seq_len, /*truncate=*/!packing);
  if (trainer.rank() == 0) {
    // See Note [Prompts longer than seq_len].
    if (examples.dropped > 0)
      logger("train")->warn(
          "{}: dropped {} of {} records whose prompt alone fills --seq-len {} (the first: {}); "
          "they leave no response token to learn. HINT: raise --seq-len.",
          what, examples.dropped, records.size(), o.seq_len, examples.first_dropped);
    if (examples.truncated > 0)
      logger("train")->warn(
          "{}: truncated {} of {} records to --seq-len {} (their responses cut "
          "short).",
          what, examples.truncated, records.size(), o.seq_len);
  }
  if (packing) examples = data::pack(examples, o.seq_len);
  TY_CHECK(examples.dropped < static_cast<std::int64_t>(records.size()), what, ": all ",
           records.size(), " records were dropped: their prompt alone fills --seq-len ", o.seq_len,
           " (the first: ", examples.first_dropped, "). HINT: raise --seq-len.");
  TY_CHECK(examples.size() > 0, what, " gives no row to train on: its ", examples.tokens(),
           " tokens fill no row of --seq-len ", o.seq_len,
           ". HINT: give more records or a shorter --seq-len.");
  auto shared = std::make_shared<const data::Examples>(std::move(examples));
  LmDataset d{.samples = shared->size(), .tokens = shared->tokens()};
  const auto pad = tokenizer.pad_id;
  d.batch = [shared, pad](const std::vector<std::int64_t>& idx) {
    return data::example_batch(*shared, idx, pad);
  };
  if (packing) {
    d.batches = sampled_batches(d.samples, o.batch_size, trainer.world_size(), trainer.rank(),
                                o.seed, shuffle);
  } else {
    const int world = trainer.world_size(), rank = trainer.rank();
    const auto batch_size = o.batch_size;
    const auto seed = o.seed;
    d.batches = [shared, world, rank, batch_size, seed](std::int64_t epoch,
                                                        std::int64_t first_batch) {
      auto all = data::length_grouped_batches(*shared, batch_size, world, rank, seed, epoch);
      all.erase(all.begin(), all.begin() + std::min<std::int64_t>(
                                               first_batch, static_cast<std::int64_t>(all.size())));
      return all;
    };
  }
  return d;
}

RunData prepare_data(const CausalLmOptions& o, Trainer& trainer) {
  auto source = resolve_model(o.model);
  auto tokenizer = tokenizer_for(o.tokenizer, source);
  const auto& config = source.config;
  TY_CHECK(tokenizer.vocab_size <= config.vocab_size(), "The tokenizer has ", tokenizer.vocab_size,
           " tokens but --model ", o.model, " embeds only ", config.vocab_size(), ".");
  TY_CHECK(o.seq_len <= config.max_position_embeddings(), "--seq-len ", o.seq_len,
           " is longer than --model ", o.model, " takes (max_position_embeddings ",
           config.max_position_embeddings(), ").");
  const auto t_prepare = Clock::now();
  RunData out{.source = std::move(source), .tokenizer = std::move(tokenizer)};
  const auto& tok = out.tokenizer;
  const auto& model_config = out.source.config;  // `config` was moved from
  if (!o.records()) {
    std::string token_cache;
    auto prepare = [&](const std::string& path) {
      auto prepared = data::prepare_text(path, tok.cache_key, tok.encode, o.seq_len, tok.pad_id);
      if (token_cache.empty()) token_cache = prepared.cache_path;
      return std::make_shared<const data::TokenizedLines>(std::move(prepared.lines));
    };
    const auto lines = prepare(o.data);
    std::vector<std::int64_t> rows(static_cast<std::size_t>(lines->size()));
    std::iota(rows.begin(), rows.end(), 0);
    std::vector<std::int64_t> held_out;
    if (o.val_fraction > 0) {  // the same seeded split on every rank
      std::mt19937_64 gen(o.seed);
      std::shuffle(rows.begin(), rows.end(), gen);
      const auto n = static_cast<std::size_t>(static_cast<double>(rows.size()) * o.val_fraction);
      TY_CHECK(n >= 1 && n < rows.size(), "--val-fraction ", o.val_fraction, " of ", rows.size(),
               " lines leaves no line to ", n == 0 ? "validate" : "train", " on.");
      held_out.assign(rows.end() - static_cast<std::ptrdiff_t>(n), rows.end());
      rows.resize(rows.size() - n);
      std::sort(rows.begin(), rows.end());
    }
    out.train = text_dataset(lines, std::move(rows), o, trainer, /*shuffle=*/true);
    if (!held_out.empty())
      out.validation = text_dataset(lines, std::move(held_out), o, trainer, false);
    out.summary["token_cache"] = token_cache;
    if (!o.val_data.empty()) {
      const auto val = prepare(o.val_data);
      std::vector<std::int64_t> all(static_cast<std::size_t>(val->size()));
      std::iota(all.begin(), all.end(), 0);
      out.validation = text_dataset(val, std::move(all), o, trainer, false);
    }
  } else {
    const data::RecordFormat format{.format = o.data_format,
                                    .prompt_template = o.prompt_template,
                                    .response_field = o.response_field};
    auto records = data::read_records(o.data, format);
    std::vector<data::PromptResponse> validation;
    if (!o.val_data.empty()) validation = data::read_records(o.val_data, format);
    if (o.val_fraction > 0)
      std::tie(records, validation) =
          data::split_records(std::move(records), o.val_fraction, o.seed);
    out.train = record_dataset(records, tok, o, trainer, o.data, /*shuffle=*/true);
    if (!validation.empty())
      out.validation = record_dataset(validation, tok, o, trainer,
                                      o.val_data.empty() ? o.data + " (held out)" : o.val_data,
                                      /*shuffle=*/false);
  }
  out.summary.update(nlohmann::ordered_json{{"data", o.data},
                                            {"data_format", data::to_string(o.data_format)},
                                            {"samples", out.train.samples},
                                            {"tokens", out.train.tokens},
                                            {"validation_samples", out.validation.samples}});
  if (o.records())
    out.summary["batching"] =
        o.batching == CausalLmOptions::Batching::kPacking ? "packing" : "padding";
  if (trainer.rank() == 0)
    logger("train")->info("{}: {} training {}, {} tokens; {} validation ({:.2f} s)", o.data,
                          out.train.samples,
                          !o.records()                                        ? "lines"
                          : o.batching == CausalLmOptions::Batching::kPacking ? "rows"
                                                                              : "records",
                          out.train.tokens, out.validation.samples, seconds_since(t_prepare));
  trainer.write_config(
      config_json(o, model_config, tok, out.summary, trainer.world_size(), trainer.threads())
          .dump());
  return out;
}

// --- phase 2: the model, wrapped ---------------------------------------------------------------

// The model under FSDP (one unit per transformer layer and per embedding: the seed's transformer
// wrapping policy) or DDP (the whole model), and the parameters its optimizer steps.
struct WrappedModel {
  models::CausalLm model{nullptr};
  std::unique_ptr<fsdp::FullyShardedDataParallel<models::CausalLm>> sharded;
  std::unique_ptr<ddp::DistributedDataParallel<models::CausalLm>> replicated;
  std::vector<torch::Tensor> params;

  torch::Tensor forward(const torch::Tensor& input_ids) {
    return sharded ? sharded->forward(input_ids) : replicated->forward(input_ids);
  }
};

// A Hugging Face folder's weights, when it has some.
std::shared_ptr<const hf::WeightReader> initial_weights(const ModelSource& source, int rank) {
  if (source.dir.empty()) return nullptr;
  if (!has_hf_weights(source.dir)) {
    if (rank == 0)
      logger("train")->warn(
          "{} holds config.json but no weights: training from a random initialisation.",
          source.dir);
    return nullptr;
  }
  auto weights = std::make_shared<const hf::WeightReader>(source.dir);
  if (rank == 0)
    logger("train")->info("Initial weights: {} ({})", source.dir,
                          hf::weight_format_name(weights->format()));
  return weights;
}

WrappedModel build_model(const CausalLmOptions& o, const ModelSource& source, Trainer& trainer) {
  const bool ddp_strategy = o.strategy == Strategy::kDdp;
  // Under FSDP the model is deferred, on any device: FSDP materialises it one unit at a time on
  // FsdpOptions.device (Hugging Face weights read slice by slice); DDP's is built on the device.
  const auto device = trainer.device();
  if (device.is_cpu() && computes_in_bf16(o.precision) && !CpuVectorUnits::of_this_cpu().avx512 &&
      trainer.rank() == 0)
    logger("train")->warn(
        "--precision {}: this CPU has no AVX-512, and LibTorch's bf16 matmul without it runs "
        "about 30x slower than fp32 (4.8 vs 141 GFLOP/s a core measured on an AVX2 EPYC). HINT: "
        "--precision fp32 here.",
        to_string(o.precision));
  WrappedModel w;
  w.model = models::make_causal_lm(source.config, {.device = ddp_strategy ? device : torch::kCPU,
                                                   .seed = o.seed,
                                                   .deferred = !ddp_strategy,
                                                   .lora = o.lora});
  // FSDP reads each rank's slices of the weights (Note [Initialising by slices]), DDP the whole
  // model on every rank.
  const auto weights = initial_weights(source, trainer.rank());
  if (ddp_strategy) {
    if (weights) models::load_hf_weights(*w.model, *weights);
    w.replicated = std::make_unique<ddp::DistributedDataParallel<models::CausalLm>>(
        w.model, trainer.dist().process_group());
    for (const auto& p : w.model->parameters())
      if (p.requires_grad()) w.params.push_back(p);  // a LoRA base is frozen
    return w;
  }
  const auto model = w.model;
  fsdp::FsdpOptions options{
      .sharding = o.strategy,
      .wrap = causal_lm_wrap_policy(model),
      .backward_prefetch = fsdp::BackwardPrefetch::kBackwardPre,
      .forward_prefetch = true,
      .limit_all_gathers = true,
      .activation_checkpointing = o.activation_checkpointing,
      // A LoRA base is rebuilt from its source on every start (Note [Frozen shards]).
      .checkpoint_frozen = !o.lora,
      .param_init = [model](const std::string& name,
                            torch::Tensor& t) { model->init_parameter(name, t); },
      .device = device};
  if (weights) {
    std::map<std::string, std::vector<std::int64_t>> shapes;
    std::vector<std::string> names;
    for (const auto& p : model->named_parameters()) {
      shapes[p.key()] = p.value().sizes().vec();
      if (!models::is_lora_parameter(p.key())) names.push_back(p.key());
    }
    models::check_hf_tensor_names(source.config, names, *weights);
    auto from_file = models::hf_slice_init(
        weights, [shapes](const std::string& name) { return shapes.at(name); });
    // LoRA's adapters are not the folder's: their slices come from their initial values.
    options.param_slice_init = [from_file, model, shapes](const std::string& name,
                                                          std::int64_t begin, std::int64_t count,
                                                          float* dst) {
      if (!models::is_lora_parameter(name)) return from_file(name, begin, count, dst);
      auto t = torch::empty(shapes.at(name), torch::kFloat32);
      model->init_parameter(name, t);
      std::copy_n(t.data_ptr<float>() + begin, count, dst);
    };
  }
  if (o.precision == Precision::kBf16Mixed)
    options.mixed_precision = {.param_dtype = torch::kBFloat16, .reduce_dtype = torch::kFloat32};
  if (o.precision == Precision::kPureBf16)  // llama-recipes' pure_bf16: all in bf16
    options.mixed_precision = {.param_dtype = torch::kBFloat16,
                               .reduce_dtype = torch::kBFloat16,
                               .shard_dtype = torch::kBFloat16};
  const auto t_build = Clock::now();
  w.sharded = std::make_unique<fsdp::FullyShardedDataParallel<models::CausalLm>>(
      w.model, trainer.dist_ptr(), options);
  w.params = w.sharded->parameters();
  if (weights)
    logger("train")->info("Read this rank's shards of {} in {:.2f} s; peak RSS so far {:.0f} MiB",
                          source.dir, seconds_since(t_build), peak_rss_mib());
  return w;
}

// FSDP's sharded checkpoint every rank writes its part of, or (DDP) rank 0's files.
std::unique_ptr<CheckpointIO> checkpoint_io(WrappedModel& w,
                                            optim::FusedAdamW& optimizer,
                                            Trainer& trainer,
                                            const std::string& run_uri) {
  if (w.sharded) return fsdp_checkpoint_io(*w.sharded, &optimizer, trainer.dist());
  const int rank = trainer.rank();
  const auto model = w.model.ptr();  // shared: the lambdas outlive this frame
  return root_checkpoint_io(
      {.collect =
           [rank, model, &optimizer] {
             std::map<std::string, std::string> files;
             if (rank != 0) return files;
             files["model.pt"] = checkpoint::module_to_bytes(*model);
             files["optimizer.pt"] = checkpoint::optimizer_to_bytes(optimizer);
             return files;
           },
       .restore =
           [model, &optimizer, run_uri](const checkpoint::LoadedCheckpoint& loaded) {
             const auto where = storage::join_uri(run_uri, loaded.name);
             for (const char* f : {"model.pt", "optimizer.pt"})
               TY_CHECK_T(CheckpointCorruptError, loaded.checkpoint.files.count(f) != 0, where,
                          " has no ", f, ".");
             checkpoint::load_module(*model, loaded.checkpoint.files.at("model.pt"),
                                     where + "/model.pt");
             checkpoint::load_optimizer(optimizer, loaded.checkpoint.files.at("optimizer.pt"),
                                        where + "/optimizer.pt");
           }},
      trainer.dist());
}

// --- phase 3: training ---------------------------------------------------------------------------

struct EpochStats {
  double train_loss = 0;            // mean of the epoch's step losses (this attempt's steps)
  double eval_loss = std::nan("");  // mean over the validation batches; nan without them
  double time_s = 0;                // the epoch's training, without evaluation
  double checkpoint_time_s = 0;     // saving the epoch's best checkpoint; 0 when not the best
};

// What this rank trained in this attempt.
struct TrainStats {
  double train_time = 0;
  std::int64_t positions = 0;  // real token positions trained (padding left out)
  // The same from the second step of this attempt on: the first allocates and warms up.
  double steady_time = 0;
  std::int64_t steady_positions = 0;
  double last_loss = std::nan("");
  int last_epoch = 0;
  std::int64_t last_step = -1;       // within its epoch, 0-based, as the seed's table shows it
  std::vector<EpochStats> epochs;    // each epoch this attempt finished
  double best_eval_loss = INFINITY;  // the run's best so far, earlier attempts' included
};

// llama-recipes' evaluation: the mean loss of the validation batches over every rank, in eval
// mode without gradients.
double evaluate(const LmDataset& validation, WrappedModel& w, Trainer& trainer, int epoch) {
  w.model->eval();
  torch::NoGradGuard no_grad;
  double sum = 0, count = 0;
  const auto device = trainer.device();
  for (const auto& idx : validation.batches(epoch, 0)) {
    const auto b = validation.batch(idx);
    const auto ids = b.input_ids.to(device);
    sum += models::causal_lm_loss(w.forward(ids), b.labels.to(device)).item<double>();
    count += 1;
  }
  auto total = torch::tensor({sum, count}, torch::kFloat64);
  trainer.all_reduce(total);
  w.model->train();
  return total[1].item<double>() > 0 ? total[0].item<double>() / total[1].item<double>()
                                     : std::nan("");
}

void set_lr(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups())
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
}

// The epoch's micro-batches from step `done_before` on, loaded in the background one at a time:
// inputs stacks input_ids and labels, targets carries the real tokens as a (1) tensor. Whole steps
// only: a tail of fewer than `accumulate` micro-batches is left out.
data::BatchLoader micro_batches(const LmDataset& train,
                                int epoch,
                                std::int64_t done_before,
                                std::int64_t accumulate) {
  auto batches = std::make_shared<std::vector<std::vector<std::int64_t>>>(
      train.batches(epoch, done_before * accumulate));
  batches->resize(batches->size() / static_cast<std::size_t>(accumulate) *
                  static_cast<std::size_t>(accumulate));
  std::vector<std::int64_t> order(batches->size());
  std::iota(order.begin(), order.end(), 0);
  return data::BatchLoader(order,
                           [batches, &train](const std::vector<std::int64_t>& one) {
                             auto b = train.batch((*batches)[static_cast<std::size_t>(one[0])]);
                             return data::Batch{torch::stack({b.input_ids, b.labels}),
                                                torch::tensor({b.tokens}, torch::kInt64)};
                           },
                           {.batch_size = 1});
}

// What one optimizer step trained on this rank.
struct StepSums {
  double loss = 0;          // the micro-batches' losses, each divided by `accumulate`
  std::int64_t tokens = 0;  // real tokens
};

// One optimizer step over `accumulate` micro-batches from `loader`; gradients are synchronised on
// the last micro-batch only.
StepSums train_step(data::BatchLoader& loader,
                    WrappedModel& w,
                    optim::FusedAdamW& optimizer,
                    std::int64_t accumulate,
                    Trainer& trainer) {
  using metrics::Phase;  // the trainer's step timer: metrics/step_timer.h
  const auto device = trainer.device();
  optimizer.zero_grad();
  StepSums sums;
  for (std::int64_t micro = 0; micro < accumulate; ++micro) {
    auto batch = loader.next();
    TY_CHECK(batch.has_value(), "The loader ran out of batches mid-step.");
    const auto inputs = batch->inputs[0].to(device), labels = batch->inputs[1].to(device);
    sums.tokens += batch->targets.item<std::int64_t>();
    trainer.phase(Phase::kForward);
    auto backward = [&] {
      auto loss = models::causal_lm_loss(w.forward(inputs), labels) / accumulate;
      at::autocast::clear_cache();
      trainer.phase(Phase::kBackward);
      loss.backward();
      sums.loss += loss.detach().item<double>();
    };
    if (micro + 1 < accumulate && w.sharded) {
      auto guard = w.sharded->no_sync();
      backward();
    } else if (micro + 1 < accumulate) {
      auto guard = w.replicated->no_sync();
      backward();
    } else {
      backward();
    }
  }
  trainer.phase(Phase::kOptimizer);
  optimizer.step();
  trainer.phase(Phase::kOther);
  return sums;
}

// After an epoch and its evaluation: the best checkpoint when the eval loss improved (as
// llama-recipes saves), and llama-recipes' epoch lines on rank 0.
void report_epoch(
    EpochStats& e, int epoch, std::int64_t epoch_steps, TrainStats& stats, Trainer& trainer) {
  const int rank = trainer.rank();
  if (!std::isnan(e.eval_loss) && e.eval_loss < stats.best_eval_loss) {
    stats.best_eval_loss = e.eval_loss;
    const auto t_checkpoint = Clock::now();
    const auto name = trainer.save_best_checkpoint(
        e.eval_loss, detail::concat("eval_epoch_loss after epoch ", epoch + 1));
    e.checkpoint_time_s = seconds_since(t_checkpoint);
    if (rank == 0)
      logger("train")->info(
          "Epoch {}: eval loss {:.4f} is the best so far: {} is kept as the best checkpoint",
          epoch + 1, e.eval_loss, name);
  }
  if (rank == 0 && epoch_steps > 0) {
    std::printf("Epoch %d: train_perplexity=%.4f, train_epoch_loss=%.4f, epoch time %.2fs\n",
                epoch + 1, std::exp(e.train_loss), e.train_loss, e.time_s);
    if (!std::isnan(e.eval_loss))
      std::printf(" eval_ppl=%.4f eval_epoch_loss=%.4f\n", std::exp(e.eval_loss), e.eval_loss);
    std::fflush(stdout);
  }
}

TrainStats train_epochs(const CausalLmOptions& o,
                        const RunData& data,
                        WrappedModel& w,
                        optim::FusedAdamW& optimizer,
                        Trainer& trainer) {
  const int rank = trainer.rank();
  const int world = trainer.world_size();
  const auto accumulate = o.gradient_accumulation_steps;
  // DDP's bf16-mixed is autocast; FSDP's is its MixedPrecision.
  nn::set_autocast(trainer.device(), o.precision == Precision::kBf16Mixed && w.replicated);
  const bool bar_enabled = o.progress && rank == 0 && interactive_output();
  TrainStats stats{.last_epoch = trainer.progress().epoch};
  // A resumed run must beat the best its earlier attempts kept, or retention would drop it.
  stats.best_eval_loss = trainer.best_checkpoint_metric().value_or(INFINITY);
  std::int64_t attempt_steps = 0;
  const std::int64_t samples_per_step = o.batch_size * accumulate;  // per rank
  bool stop = o.max_steps >= 0 && trainer.progress().global_step >= o.max_steps;
  for (int epoch = trainer.progress().epoch; epoch < o.epochs && !stop; ++epoch) {
    w.model->train();
    const double lr = o.effective_lr() * std::pow(o.effective_gamma(), epoch);  // StepLR
    set_lr(optimizer, lr);
    const std::int64_t first_position =
        trainer.progress().epoch == epoch ? trainer.progress().epoch_position : std::int64_t{0};
    // Steps of this epoch done before this attempt (by the run this one resumed).
    const std::int64_t done_before = first_position / (samples_per_step * world);
    data::BatchLoader loader = micro_batches(data.train, epoch, done_before, accumulate);
    const std::int64_t steps = loader.num_batches() / accumulate;
    trainer.begin_epoch(epoch, steps);
    const std::int64_t epoch_batches = done_before + steps;
    ProgressBar bar(bar_enabled, epoch, epoch_batches);
    auto epoch_start = Clock::now();
    double loss_sum = 0;
    std::int64_t epoch_steps = 0;
    for (std::int64_t step = 0; step < steps; ++step) {
      const auto step_start = Clock::now();
      const StepSums sums = train_step(loader, w, optimizer, accumulate, trainer);
      // The step's mean loss and the job's real tokens, in one all-reduce.
      auto reduced =
          torch::tensor({sums.loss / world, static_cast<double>(sums.tokens)}, torch::kFloat64);
      trainer.all_reduce(reduced);
      stats.last_loss = reduced[0].item<double>();
      const double job_tokens = reduced[1].item<double>();
      loss_sum += stats.last_loss;
      ++epoch_steps;
      stats.positions += sums.tokens;
      const double step_s = seconds_since(step_start);
      if (attempt_steps++ > 0) {
        stats.steady_time += step_s;
        stats.steady_positions += sums.tokens;
      }
      const double tokens_per_s = job_tokens / step_s;
      stats.last_epoch = epoch;
      stats.last_step = done_before + trainer.epoch_steps();
      trainer.step_done(
          samples_per_step,
          {{"train_loss", stats.last_loss}, {"tokens_per_s", tokens_per_s}, {"lr", lr}},
          /*tokens=*/sums.tokens);
      if (rank == 0) {
        if (bar_enabled) {
          bar.update(stats.last_step + 1, stats.last_loss);
        } else {
          std::printf("epoch %d step %lld/%lld: loss %.5f, %.0f tokens/s\n", epoch,
                      static_cast<long long>(stats.last_step + 1),
                      static_cast<long long>(epoch_batches), stats.last_loss, tokens_per_s);
          std::fflush(stdout);
        }
      }
      if (o.max_steps >= 0 && trainer.progress().global_step >= o.max_steps) {
        stop = true;
        break;
      }
    }
    EpochStats e{.time_s = seconds_since(epoch_start)};
    stats.train_time += e.time_s;
    e.train_loss = epoch_steps > 0 ? loss_sum / static_cast<double>(epoch_steps) : std::nan("");
    if (data.validation.samples > 0) e.eval_loss = evaluate(data.validation, w, trainer, epoch);
    if (!stop) trainer.end_epoch();
    report_epoch(e, epoch, epoch_steps, stats, trainer);
    if (epoch_steps > 0) stats.epochs.push_back(e);
  }
  return stats;
}

// --- phase 4: the result -------------------------------------------------------------------------

// The last epoch's losses and perplexities, and the run's averages as llama-recipes names them
// (its "avg_train_prep" is the perplexity); shown in the table for records (seed 002).
void add_epoch_metrics(const CausalLmOptions& o, const TrainStats& stats, Result& result) {
  if (stats.epochs.empty()) return;
  const bool show = o.records();
  const auto& last = stats.epochs.back();
  const bool evaluated = !std::isnan(last.eval_loss);
  result.metrics.push_back({"train_perplexity", std::exp(last.train_loss), 4, false});
  result.metrics.push_back({"train_epoch_loss", last.train_loss, 4, false});
  if (evaluated) {
    result.metrics.push_back({"eval_ppl", std::exp(last.eval_loss), 4, false});
    result.metrics.push_back({"eval_epoch_loss", last.eval_loss, 4, false});
  }
  double prep = 0, loss = 0, eval_prep = 0, eval_loss = 0, time = 0, checkpoint = 0;
  for (const auto& e : stats.epochs) {
    prep += std::exp(e.train_loss);
    loss += e.train_loss;
    eval_prep += std::exp(e.eval_loss);
    eval_loss += e.eval_loss;
    time += e.time_s;
    checkpoint += e.checkpoint_time_s;
  }
  const double n = static_cast<double>(stats.epochs.size());
  result.metrics.push_back({"avg_train_prep", prep / n, 4, show});
  result.metrics.push_back({"avg_train_loss", loss / n, 4, show});
  if (evaluated) {
    result.metrics.push_back({"avg_eval_prep", eval_prep / n, 4, show});
    result.metrics.push_back({"avg_eval_loss", eval_loss / n, 4, show});
  }
  result.metrics.push_back({"avg_epoch_time", time / n, 3, show});
  result.metrics.push_back({"avg_checkpoint_time", checkpoint / n, 3, show});
}

// Throughput over the slowest rank's training time, every rank's peak memory.
Result report_result(const CausalLmOptions& o,
                     const TrainStats& stats,
                     const std::string& last_checkpoint,
                     Trainer& trainer) {
  const int rank = trainer.rank();
  const int world = trainer.world_size();
  auto slowest = torch::tensor({stats.train_time, stats.steady_time}, torch::kFloat64);
  trainer.all_reduce(slowest, /*max=*/true);
  auto trained = torch::tensor(
      {static_cast<double>(stats.positions), static_cast<double>(stats.steady_positions)},
      torch::kFloat64);
  trainer.all_reduce(trained);
  auto rss = torch::zeros({world}, torch::kFloat64);
  rss[rank] = peak_rss_mib();
  trainer.all_reduce(rss);
  const double train_time_s = slowest[0].item<double>();
  const double tokens_per_s = train_time_s > 0 ? trained[0].item<double>() / train_time_s : 0;
  // Token positions (padding included: they are computed) per second of the slowest rank.
  const double steady_tokens_per_s =
      slowest[1].item<double>() > 0 ? trained[1].item<double>() / slowest[1].item<double>() : 0;
  // A run resumed at its end (--epochs or --max-steps already reached) trained nothing: it
  // reports no step, loss or throughput rather than 0, nan and 0.
  const bool trained_any = trained[0].item<double>() > 0;
  Result result{.checkpoint_dir_name = last_checkpoint,
                .metrics = {{"epoch", double(std::min(stats.last_epoch, o.epochs - 1)), 0}}};
  if (trained_any) {
    result.metrics.push_back({"step", double(stats.last_step), 0});
    result.metrics.push_back({"train_loss", stats.last_loss, 5});
  }
  result.metrics.push_back({"global_step", double(trainer.progress().global_step), 0, false});
  if (trained_any) {
    result.metrics.push_back({"tokens_per_s", tokens_per_s, 1, false});
    result.metrics.push_back({"steady_tokens_per_s", steady_tokens_per_s, 1, false});
  }
  result.metrics.push_back({"train_time_s", train_time_s, 3, false});
  result.metrics.push_back({"world_size", double(world), 0, false});
  result.metrics.push_back({"restart_count", double(trainer.restart_count()), 0, false});
  for (int r = 0; r < world; ++r)
    result.metrics.push_back(
        {detail::concat("peak_rss_mib_rank", r), rss[r].item<double>(), 1, false});
  add_epoch_metrics(o, stats, result);
  if (rank == 0 && !trained_any) {
    logger("train")->info(
        "Nothing left to train: {} is at step {} (epoch {}), the end that --epochs {}{} sets. "
        "HINT: raise --epochs or --max-steps to train on, or give --name a new run.",
        last_checkpoint, trainer.progress().global_step, trainer.progress().epoch, o.epochs,
        o.max_steps >= 0 ? detail::concat(" / --max-steps ", o.max_steps) : std::string());
  } else if (rank == 0) {
    std::string per_rank;
    for (int r = 0; r < world; ++r)
      per_rank += detail::concat(r == 0 ? "" : ", ", "rank ", r, " ",
                                 static_cast<long long>(rss[r].item<double>()), " MiB");
    std::printf(
        "Trained %lld steps: %.1f tokens/s (%.1f after the first step), train_loss %.5f; peak "
        "memory %s\n",
        static_cast<long long>(trainer.progress().global_step), tokens_per_s, steady_tokens_per_s,
        stats.last_loss, per_rank.c_str());
    std::fflush(stdout);
  }
  return result;
}

// What the run trains, as the checkpoints' setup.json says it: "full fine-tune", or
// "LoRA (r 8, alpha 16, targets q_proj,v_proj)".
std::string training_kind(const CausalLmOptions& o) {
  if (!o.lora) return "full fine-tune";
  std::string targets;
  for (const auto& t : o.lora->targets) targets += (targets.empty() ? "" : ",") + t;
  return detail::concat("LoRA (r ", o.lora->r, ", alpha ", o.lora->alpha, ", targets ", targets,
                        ")");
}

// A resumed LoRA run's adapters were trained on `base` (Note [A LoRA checkpoint's base]).
void check_resumed_base(Trainer& trainer, const std::string& base) {
  const auto where = storage::join_uri(trainer.run().uri(), trainer.resumed_from());
  if (const auto recorded = trainer.resumed_file(kLoraBaseFile)) {
    check_same_base(*recorded, base, where);
  } else if (trainer.rank() == 0) {
    logger("train")->warn(
        "{} holds no {} (it predates them): whether its adapters were trained on this base "
        "cannot be checked.",
        where, kLoraBaseFile);
  }
}

}  // namespace

void CausalLmOptions::validate() const {
  run.validate();
  scaling.validate();
  TY_CHECK(std::find(std::begin(kTrainingStrategies), std::end(kTrainingStrategies), strategy) !=
               std::end(kTrainingStrategies),
           "--strategy ", to_string(strategy), " is not one the causal-LM recipe runs; give ",
           strategy_names(kTrainingStrategies), ".");
  TY_CHECK(!data.empty(),
           "--data must name a text file to train on (e.g. "
           "/usr/share/games/fortunes/fortunes, or tiny_shakespeare's input.txt).");
  TY_CHECK(!(strategy == Strategy::kDdp && precision == Precision::kPureBf16),
           "--pure-bf16 needs an FSDP --strategy (its shards are the bf16 parameters): DDP keeps "
           "fp32 parameters. HINT: --strategy no_shard replicates as DDP does, or use "
           "--precision bf16-mixed with ddp.");
  TY_CHECK(!(strategy == Strategy::kDdp && activation_checkpointing),
           "--activation-checkpointing needs an FSDP --strategy (it checkpoints each FSDP unit); "
           "drop it with --strategy ddp.");
  TY_CHECK(seq_len >= 2 && seq_len <= (1 << 16), "--seq-len must be in [2, 65536], got ", seq_len,
           ".");
  TY_CHECK(batch_size >= 1, "--batch-size must be >= 1, got ", batch_size, ".");
  TY_CHECK(epochs >= 1, "--epochs must be >= 1, got ", epochs, ".");
  TY_CHECK(!lr || *lr > 0, "--lr must be > 0, got ", lr.value_or(0), ".");
  TY_CHECK(!gamma || (*gamma > 0 && *gamma <= 1), "--gamma must be in (0, 1], got ",
           gamma.value_or(0), ".");
  TY_CHECK(gradient_accumulation_steps >= 1, "--gradient-accumulation-steps must be >= 1, got ",
           gradient_accumulation_steps, ".");
  TY_CHECK(val_fraction >= 0 && val_fraction < 1, "--val-fraction must be in [0, 1), got ",
           val_fraction, ".");
  TY_CHECK(val_data.empty() || val_fraction == 0,
           "Give --val-data or --val-fraction, not both: one is the validation set.");
  TY_CHECK(data_format == data::DataFormat::kJsonl ||
               (prompt_template.empty() && response_field.empty()),
           "--prompt-template and --response-field belong to --data-format jsonl (",
           data::to_string(data_format), " has its own prompt).");
  TY_CHECK(data_format != data::DataFormat::kJsonl ||
               (!prompt_template.empty() && !response_field.empty()),
           "--data-format jsonl needs --prompt-template (e.g. \"Question: {question}\\nAnswer: "
           "\") and --response-field (e.g. answer).");
  TY_CHECK(eps > 0, "--eps must be > 0, got ", eps, ".");
  TY_CHECK(weight_decay >= 0, "--weight-decay must be >= 0, got ", weight_decay, ".");
  if (lora) lora->validate();
  check_model_flag(model);
  TY_CHECK(max_steps == -1 || max_steps >= 1,
           "--max-steps must be >= 1 (or omitted for all epochs), got ", max_steps, ".");
}

fsdp::WrapPolicy causal_lm_wrap_policy(const models::CausalLm& model) {
  return fsdp::wrap_any_of(
      {fsdp::WrapPolicy{.wraps = [model](const std::string&, const torch::nn::Module& m,
                                         std::int64_t) { return model->is_layer(m); }},
       fsdp::wrap_modules_named(model->unit_names())});
}

Result run_causal_lm_rank(const CausalLmOptions& o) {
  o.validate();
  Trainer trainer("causal-lm", o.run, o.scaling);
  const auto data = prepare_data(o, trainer);
  auto wrapped = build_model(o, data.source, trainer);
  optim::FusedAdamW optimizer(
      wrapped.params,
      torch::optim::AdamWOptions(o.effective_lr()).eps(o.eps).weight_decay(o.weight_decay));
  const auto io = checkpoint_io(wrapped, optimizer, trainer, o.run.uri());
  trainer.guard_weights(wrapped.params);
  trainer.describe_setup({{"training", training_kind(o)},
                          {"precision", std::string(to_string(o.precision))},
                          {"strategy", std::string(to_string(o.strategy))}});
  std::string base;  // Note [A LoRA checkpoint's base]
  if (o.lora) {
    base = base_fingerprint(o.model, data.source);
    trainer.add_checkpoint_file(kLoraBaseFile, base);
  }
  trainer.resume(*io, [&] {
    if (o.lora) check_resumed_base(trainer, base);
  });
  const auto stats = train_epochs(o, data, wrapped, optimizer, trainer);
  const std::string last_checkpoint = trainer.finish_training();
  auto result = report_result(o, stats, last_checkpoint, trainer);
  trainer.write_result(result);
  return result;
}

}  // namespace trainyard::train
