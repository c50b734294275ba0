#include "trainyard/train/causal_lm.h"

#include <ATen/autocast_mode.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "train/causal_lm_source.h"
#include "trainyard/blas_core.h"
#include "trainyard/checkpoint/checkpointer.h"
#include "trainyard/checkpoint/torch_state.h"
#include "trainyard/comm/process_group.h"
#include "trainyard/cpu_count.h"
#include "trainyard/data/batch_loader.h"
#include "trainyard/data/distributed_sampler.h"
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
                                   const data::PreparedText& text,
                                   int world_size,
                                   int threads) {
  return {{"recipe", "causal-lm"},
          {"model", o.model},
          {"model_type", config.model_type()},
          {"parameters", config.parameter_count()},
          {"data", o.data},
          {"lines", text.lines.size()},
          {"tokens", text.lines.tokens()},
          {"token_cache", text.cache_path},
          {"tokenizer", tokenizer.id},
          {"strategy", to_string(o.strategy)},
          {"precision", o.precision},
          {"activation_checkpointing", o.activation_checkpointing},
          {"world_size", world_size},
          {"threads_per_rank", threads},
          {"blas_core", blas_core_name()},
          {"seq_len", o.seq_len},
          {"batch_size", o.batch_size},
          {"epochs", o.epochs},
          {"max_steps", o.max_steps},
          {"optimizer", "AdamW (FusedAdamW)"},
          {"lr", o.lr},
          {"eps", o.eps},
          {"weight_decay", o.weight_decay},
          {"seed", o.seed},
          {"storage", o.run.storage},
          {"name", o.run.name},
          {"checkpoint_every", o.run.checkpoint_every},
          {"num_to_keep", o.run.num_to_keep}};
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

struct RunData {
  ModelSource source;
  TextTokenizer tokenizer;
  data::PreparedText text;
};

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
  auto text = data::prepare_text(o.data, tokenizer.cache_key, tokenizer.encode, o.seq_len,
                                 tokenizer.pad_id);
  if (trainer.rank() == 0)
    logger("train")->info("{}: {} training lines, {} tokens ({} {:.2f} s)", o.data,
                          text.lines.size(), text.lines.tokens(),
                          text.from_cache ? "read from " : "prepared in", seconds_since(t_prepare));
  trainer.write_config(
      config_json(o, config, tokenizer, text, trainer.world_size(), trainer.threads()).dump());
  return {std::move(source), std::move(tokenizer), std::move(text)};
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
  const bool ddp_strategy = o.strategy.is_ddp();
  // Under FSDP the model is deferred, on any device: FSDP materialises it one unit at a time on
  // FsdpOptions.device (Hugging Face weights read slice by slice); DDP's is built on the device.
  const auto device = trainer.device();
  WrappedModel w;
  w.model = models::make_causal_lm(
      source.config,
      {.device = ddp_strategy ? device : torch::kCPU, .seed = o.seed, .deferred = !ddp_strategy});
  // FSDP reads each rank's slices of the weights (Note [Initialising by slices]), DDP the whole
  // model on every rank.
  const auto weights = initial_weights(source, trainer.rank());
  if (ddp_strategy) {
    if (weights) models::load_hf_weights(*w.model, *weights);
    w.replicated = std::make_unique<ddp::DistributedDataParallel<models::CausalLm>>(
        w.model, trainer.dist().process_group());
    w.params = w.model->parameters();
    return w;
  }
  const auto model = w.model;
  fsdp::FsdpOptions options{
      .sharding = *o.strategy.sharding,
      .wrap = fsdp::wrap_any_of(
          {fsdp::WrapPolicy{.wraps = [model](const std::string&, const torch::nn::Module& m,
                                             std::int64_t) { return model->is_layer(m); }},
           fsdp::wrap_modules_named(model->unit_names())}),
      .backward_prefetch = fsdp::BackwardPrefetch::kBackwardPre,
      .forward_prefetch = true,
      .limit_all_gathers = true,
      .activation_checkpointing = o.activation_checkpointing,
      .param_init = [model](const std::string& name,
                            torch::Tensor& t) { model->init_parameter(name, t); },
      .device = device};
  if (weights) {
    std::map<std::string, std::vector<std::int64_t>> shapes;
    std::vector<std::string> names;
    for (const auto& p : model->named_parameters()) {
      shapes[p.key()] = p.value().sizes().vec();
      names.push_back(p.key());
    }
    models::check_hf_tensor_names(names, *weights);
    options.param_slice_init = models::hf_slice_init(
        weights, [shapes](const std::string& name) { return shapes.at(name); });
  }
  if (o.precision == "bf16-mixed")
    options.mixed_precision = {.param_dtype = torch::kBFloat16, .reduce_dtype = torch::kFloat32};
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

// What this rank trained in this attempt.
struct TrainStats {
  double train_time = 0;
  std::int64_t positions = 0;  // token positions trained
  // The same from the second step of this attempt on: the first allocates and warms up.
  double steady_time = 0;
  std::int64_t steady_positions = 0;
  double last_loss = std::nan("");
  int last_epoch = 0;
  std::int64_t last_step = -1;  // within its epoch, 0-based, as the seed's table shows it
};

TrainStats train_epochs(const CausalLmOptions& o,
                        const data::PreparedText& text,
                        WrappedModel& w,
                        optim::FusedAdamW& optimizer,
                        Trainer& trainer) {
  const int rank = trainer.rank();
  const int world = trainer.world_size();
  const auto device = trainer.device();
  // DDP's bf16-mixed is autocast; FSDP's is its MixedPrecision.
  nn::set_autocast(device, o.precision == "bf16-mixed" && w.replicated);
  data::DistributedSampler sampler({.dataset_size = text.lines.size(),
                                    .num_replicas = world,
                                    .rank = rank,
                                    .shuffle = true,
                                    .seed = o.seed});
  auto make_batch = [&text, device](const std::vector<std::int64_t>& idx) {
    auto b = data::causal_lm_batch(text.lines, idx);
    return data::Batch{b.input_ids.to(device), b.labels.to(device)};
  };
  const bool bar_enabled = o.progress && rank == 0 && interactive_output();
  TrainStats stats{.last_epoch = trainer.progress().epoch};
  std::int64_t attempt_steps = 0;
  bool stop = o.max_steps >= 0 && trainer.progress().global_step >= o.max_steps;
  for (int epoch = trainer.progress().epoch; epoch < o.epochs && !stop; ++epoch) {
    sampler.set_epoch(epoch);
    w.model->train();
    const std::int64_t first_position =
        trainer.progress().epoch == epoch ? trainer.progress().epoch_position : std::int64_t{0};
    data::BatchLoader loader(sampler.indices(first_position), make_batch,
                             {.batch_size = o.batch_size});
    trainer.begin_epoch(epoch, loader.num_batches());
    // Steps of this epoch done before this attempt (by the run this one resumed).
    const std::int64_t done_before = first_position / (o.batch_size * world);
    const std::int64_t epoch_batches = done_before + loader.num_batches();
    ProgressBar bar(bar_enabled, epoch, epoch_batches);
    auto epoch_start = Clock::now();
    using metrics::Phase;  // the trainer's step timer: metrics/step_timer.h
    while (auto batch = loader.next()) {
      const auto step_start = Clock::now();
      trainer.phase(Phase::kForward);
      optimizer.zero_grad();
      auto loss = models::causal_lm_loss(w.forward(batch->inputs), batch->targets);
      at::autocast::clear_cache();
      trainer.phase(Phase::kBackward);
      loss.backward();
      trainer.phase(Phase::kOptimizer);
      optimizer.step();
      trainer.phase(Phase::kOther);
      auto mean = loss.detach().to(torch::kFloat64).reshape({1}) / world;
      trainer.all_reduce(mean);
      stats.last_loss = mean.item<double>();
      stats.positions += batch->inputs.numel();
      const double step_s = seconds_since(step_start);
      if (attempt_steps++ > 0) {
        stats.steady_time += step_s;
        stats.steady_positions += batch->inputs.numel();
      }
      const double tokens_per_s = static_cast<double>(batch->inputs.numel() * world) / step_s;
      stats.last_epoch = epoch;
      stats.last_step = done_before + trainer.epoch_steps();
      trainer.step_done(
          o.batch_size,
          {{"train_loss", stats.last_loss}, {"tokens_per_s", tokens_per_s}, {"lr", o.lr}},
          /*tokens=*/batch->inputs.numel());
      if (rank == 0) {
        if (bar_enabled) {
          bar.update(stats.last_step + 1, stats.last_loss);
        } else {
          std::printf("epoch %d step %lld/%lld: train_loss %.5f, %.0f tokens/s\n", epoch,
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
    stats.train_time += seconds_since(epoch_start);
    if (!stop) trainer.end_epoch();
  }
  return stats;
}

// --- phase 4: the result -------------------------------------------------------------------------

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

}  // namespace

void CausalLmOptions::validate() const {
  run.validate();
  scaling.validate();
  TY_CHECK(!data.empty(),
           "--data must name a text file to train on (e.g. "
           "/usr/share/games/fortunes/fortunes, or tiny_shakespeare's input.txt).");
  TY_CHECK(precision == "bf16-mixed" || precision == "fp32",
           "--precision must be bf16-mixed or fp32, got '", precision, "'.");
  TY_CHECK(!(strategy.is_ddp() && activation_checkpointing),
           "--activation-checkpointing needs an FSDP --strategy (it checkpoints each FSDP unit); "
           "drop it with --strategy ddp.");
  TY_CHECK(seq_len >= 2 && seq_len <= (1 << 16), "--seq-len must be in [2, 65536], got ", seq_len,
           ".");
  TY_CHECK(batch_size >= 1, "--batch-size must be >= 1, got ", batch_size, ".");
  TY_CHECK(epochs >= 1, "--epochs must be >= 1, got ", epochs, ".");
  TY_CHECK(lr > 0, "--lr must be > 0, got ", lr, ".");
  TY_CHECK(eps > 0, "--eps must be > 0, got ", eps, ".");
  TY_CHECK(weight_decay >= 0, "--weight-decay must be >= 0, got ", weight_decay, ".");
  check_model_flag(model);
  TY_CHECK(max_steps == -1 || max_steps >= 1,
           "--max-steps must be >= 1 (or omitted for all epochs), got ", max_steps, ".");
}

Result run_causal_lm_rank(const CausalLmOptions& o) {
  o.validate();
  Trainer trainer("causal-lm", o.run, o.scaling);
  const auto data = prepare_data(o, trainer);
  auto wrapped = build_model(o, data.source, trainer);
  optim::FusedAdamW optimizer(
      wrapped.params, torch::optim::AdamWOptions(o.lr).eps(o.eps).weight_decay(o.weight_decay));
  const auto io = checkpoint_io(wrapped, optimizer, trainer, o.run.uri());
  trainer.resume(*io);
  const auto stats = train_epochs(o, data.text, wrapped, optimizer, trainer);
  const std::string last_checkpoint = trainer.finish_training();
  auto result = report_result(o, stats, last_checkpoint, trainer);
  trainer.write_result(result);
  return result;
}

}  // namespace trainyard::train
