#include "trainyard/train/causal_lm.h"

#include <ATen/autocast_mode.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

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
#include "trainyard/hf/tokenizer.h"
#include "trainyard/hf/weight_reader.h"
#include "trainyard/log.h"
#include "trainyard/models/gpt_neox.h"
#include "trainyard/models/hf_weights.h"
#include "trainyard/nn/autocast.h"
#include "trainyard/optim/fused_adamw.h"
#include "trainyard/train/trainer.h"

namespace trainyard::train {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

const std::vector<std::string>& strategies() {
  static const std::vector<std::string> names = {
      "full_shard", "shard_grad_op", "hybrid_shard", "hybrid_shard_grad_op", "no_shard", "ddp"};
  return names;
}

// Where the model comes from: a preset, or a folder with a Hugging Face config.json.
struct ModelSource {
  models::GptNeoXConfig config;
  std::string dir;  // empty for a preset
};

// Throws InvalidArgumentError unless `model` is a folder or a preset name.
bool is_remote(const std::string& model) {
  return model.rfind("s3://", 0) == 0;
}

// A local path for "file:///dir" URIs; anything else unchanged.
std::string local_path(const std::string& model) {
  return model.rfind("file://", 0) == 0 ? model.substr(7) : model;
}

// Throws InvalidArgumentError unless `model` is a folder, a storage URI or a preset name.
void check_model_flag(const std::string& model) {
  std::error_code ec;
  if (is_remote(model) || fs::is_directory(local_path(model), ec)) return;
  const auto& presets = models::GptNeoXConfig::preset_names();
  if (std::find(presets.begin(), presets.end(), model) != presets.end()) return;
  std::string known;
  for (const auto& p : presets) known += (known.empty() ? "" : ", ") + p;
  throw InvalidArgumentError(detail::concat("--model ", model,
                                            " is neither a folder holding config.json (a path, "
                                            "file:// or s3:// URI) nor a preset (",
                                            known, ")."));
}

// Note [Models on storage]
// A model folder on remote storage (s3://) is copied file by file into the local cache,
// ($XDG_CACHE_HOME or ~/.cache)/trainyard/models/<the URI's SHA-256, 12 digits>/, each file in
// 64 MiB ranged reads (storage::download) so that no file is ever held in memory, as Hugging
// Face's hub cache does; a file already there is kept. Each copy is written under a temporary
// name and renamed, so ranks of one node fetching at once never see half a file. Then the folder
// is read locally, by slices, like any other.
std::string cached_model_dir(const std::string& uri) {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const fs::path root = xdg != nullptr && *xdg != '\0' ? fs::path(xdg) / "trainyard"
                        : home != nullptr              ? fs::path(home) / ".cache/trainyard"
                                                       : fs::path("/tmp/trainyard-cache");
  const auto dir = root / "models" / checkpoint::sha256_hex(uri).substr(0, 12);
  auto remote = storage::open_storage(uri);
  std::size_t files = 0;
  for (const auto& key : remote->list("")) {
    if (key.find('/') != std::string::npos) continue;  // the folder's own files only
    ++files;
    if (fs::exists(dir / key)) continue;
    logger("train")->info("Fetching {} into {}", storage::join_uri(uri, key), dir.string());
    storage::download(*remote, key, (dir / key).string());
  }
  TY_CHECK(files > 0, "--model ", uri, " holds no file. HINT: upload the model folder there.");
  return dir.string();
}

ModelSource resolve_model(const std::string& model) {
  check_model_flag(model);
  std::error_code ec;
  const std::string dir = is_remote(model) ? cached_model_dir(model) : local_path(model);
  if (!fs::is_directory(dir, ec)) return {models::GptNeoXConfig::preset(model), ""};
  const auto path = fs::path(dir) / "config.json";
  std::ifstream in(path);
  TY_CHECK(in.good(), "--model ", model,
           " has no config.json. HINT: a Hugging Face model folder "
           "holds config.json next to its weights.");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    return {models::GptNeoXConfig::from_json(text), dir};
  } catch (const Error& e) {
    throw InvalidArgumentError(detail::concat(path.string(), ": ", e.what()));
  }
}

// Whether `dir` holds weights hf::WeightReader reads.
bool has_hf_weights(const std::string& dir) {
  for (auto name :
       {hf::kSafetensorsName, hf::kSafetensorsIndexName, hf::kTorchBinName, hf::kTorchBinIndexName})
    if (fs::exists(fs::path(dir) / name)) return true;
  return false;
}

TextTokenizer byte_tokenizer() {
  return {.id = "bytes",
          .cache_key = "bytes",
          .encode =
              [](std::string_view text) {
                return std::vector<std::int32_t>(
                    reinterpret_cast<const unsigned char*>(text.data()),
                    reinterpret_cast<const unsigned char*>(text.data()) + text.size());
              },
          .decode =
              [](const std::vector<std::int64_t>& ids) {
                std::string text;
                for (auto id : ids) text += id >= 0 && id < 256 ? static_cast<char>(id) : '?';
                return text;
              },
          .pad_id = 0,
          .vocab_size = 256};
}

TextTokenizer tokenizer_for(const CausalLmOptions& o, const ModelSource& source) {
  std::string path = o.tokenizer;
  if (path.empty() && !source.dir.empty() && fs::exists(fs::path(source.dir) / "tokenizer.json"))
    path = (fs::path(source.dir) / "tokenizer.json").string();
  return load_text_tokenizer(path.empty() ? "bytes" : path);
}

nlohmann::ordered_json config_json(const CausalLmOptions& o,
                                   const models::GptNeoXConfig& config,
                                   const TextTokenizer& tokenizer,
                                   const data::PreparedText& text,
                                   int world_size,
                                   int threads) {
  return {{"recipe", "causal-lm"},
          {"model", o.model},
          {"parameters", config.parameter_count()},
          {"data", o.data},
          {"lines", text.lines.size()},
          {"tokens", text.lines.tokens()},
          {"token_cache", text.cache_path},
          {"tokenizer", tokenizer.id},
          {"strategy", o.strategy},
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

}  // namespace

TextTokenizer load_text_tokenizer(const std::string& id) {
  if (id == "bytes") return byte_tokenizer();
  auto tokenizer = std::make_shared<const hf::Tokenizer>(hf::Tokenizer::from_file(id));
  std::ifstream in(id, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return {.id = id,
          .cache_key = "tokenizer.json " + checkpoint::sha256_hex(text),
          .encode =
              [tokenizer](std::string_view line) {
                return tokenizer->encode(line, /*add_special_tokens=*/true);
              },
          .decode =
              [tokenizer](const std::vector<std::int64_t>& ids) {
                const std::vector<std::int32_t> narrow(ids.begin(), ids.end());
                return tokenizer->decode(narrow, /*skip_special_tokens=*/true);
              },
          // The seed pads with the end-of-text token when the tokenizer names no padding.
          .pad_id = tokenizer->pad_id().value_or(tokenizer->eos_id().value_or(0)),
          .eos_id = tokenizer->eos_id() ? *tokenizer->eos_id() : -1,
          .vocab_size = tokenizer->vocab_size()};
}

namespace {

// Note [A reader checks the model's size]
// generate and export build a whole model in one process, fp32: parameter_count() x 4 bytes (the
// count the memory planner plans with). Before allocating, that is compared with what the process
// may still take (available_memory_bytes: MemAvailable capped by the cgroup limit), so that a
// config.json describing a model far larger than meant fails at once, naming its size, instead
// of growing until the kernel kills the process. Unknown memory (no /proc) checks nothing.
void check_model_fits(const models::GptNeoXConfig& config, const std::string& what) {
  const auto available = available_memory_bytes();
  if (!available) return;
  const double params = static_cast<double>(config.parameter_count());
  const double need = params * sizeof(float);
  if (need <= static_cast<double>(*available)) return;
  char sizes[160];
  std::snprintf(sizes, sizeof sizes,
                "%.3g billion parameters, %.3g GB in fp32, but this process "
                "may take only %.3g GB",
                params / 1e9, need / 1e9, static_cast<double>(*available) / 1e9);
  throw InvalidArgumentError(detail::concat(
      what, " describes a GPT-NeoX of ", sizes,
      " (MemAvailable, capped by the cgroup memory limit): hidden_size ", config.hidden_size,
      ", num_hidden_layers ", config.num_hidden_layers, ", intermediate_size ",
      config.intermediate_size, ", vocab_size ", config.vocab_size,
      ". HINT: check those sizes in its config.json, or run on a machine with more memory."));
}

// A run's folder: its model (untrained) and tokenizer, from its config.json.
LoadedLm untrained_model_of_run(const std::string& run_uri,
                                std::uint64_t seed,
                                bool deferred = false) {
  const auto text = storage::open_storage(run_uri)->read("config.json");
  TY_CHECK(text.has_value(), run_uri, " has no config.json: it is not a causal-lm run's folder.");
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(*text);
  } catch (const std::exception& e) {
    throw CorruptDataError(detail::concat(run_uri, "/config.json is not valid JSON: ", e.what()));
  }
  TY_CHECK(config.value("recipe", "") == "causal-lm", run_uri,
           "/config.json is not a causal-lm run's (recipe \"", config.value("recipe", ""), "\").");
  const auto source = resolve_model(config.at("model").get<std::string>());
  // See Note [A reader checks the model's size]; a deferred model allocates nothing.
  if (!deferred) check_model_fits(source.config, run_uri + "'s model " + config.value("model", ""));
  return {models::GptNeoX(source.config, models::GptNeoXInit{.seed = seed, .deferred = deferred}),
          load_text_tokenizer(config.value("tokenizer", "bytes")), run_uri};
}

// A sharded checkpoint's parameters, read by ranges (Note [Reading parameters by ranges]), after
// every file of the checkpoint is checked against its SHA-256, streamed, as a resume checks it.
std::unique_ptr<fsdp::ShardedParameterReader> parameter_reader(
    checkpoint::Checkpointer& checkpointer,
    const checkpoint::Manifest& manifest,
    const std::string& where) {
  std::map<std::string, std::uint64_t> sizes;
  for (const auto& [file, digest] : manifest.files) {
    sizes[file] = digest.bytes;
    if (file != fsdp::kShardedMetadataFile) checkpointer.verify_file(manifest, file);
  }
  auto& store = checkpointer.storage();
  const auto prefix = manifest.name + "/";
  return std::make_unique<fsdp::ShardedParameterReader>(
      checkpointer.read_file(manifest, fsdp::kShardedMetadataFile),
      [&store, prefix, where](const std::string& file, std::uint64_t offset, std::uint64_t length) {
        auto bytes = store.read_range(prefix + file, offset, length);
        TY_CHECK_T(CheckpointCorruptError, bytes.has_value(), where, "/", file, " is missing.");
        return std::move(*bytes);
      },
      std::move(sizes), where);
}

// Loads checkpoint `name` of the run, verified, into `lm.model`. Throws CheckpointCorruptError
// naming the file that fails verification.
void load_run_checkpoint(LoadedLm& lm,
                         checkpoint::Checkpointer& checkpointer,
                         const std::string& run_uri,
                         const std::string& name) {
  const auto manifest = checkpointer.read_manifest(name);
  const auto where = storage::join_uri(run_uri, manifest.name);
  if (manifest.files.count(fsdp::kShardedMetadataFile) != 0) {
    fsdp::load_sharded_into_module(*lm.model, *parameter_reader(checkpointer, manifest, where),
                                   where);
  } else {
    TY_CHECK_T(CheckpointCorruptError, manifest.files.count("model.pt") != 0, where,
               " holds neither ", fsdp::kShardedMetadataFile, " nor model.pt.");
    checkpoint::load_module(*lm.model, checkpointer.read_file(manifest, "model.pt"),
                            where + "/model.pt");
  }
  lm.description = detail::concat(where, " (step ", manifest.step, ")");
}

// Loads the newest checkpoint of the run that verifies into `lm.model`, as a resume chooses it
// (Checkpointer::load_latest): each newer one that fails verification is skipped with a warning
// naming the file. Throws CheckpointCorruptError listing every failure when none loads.
void load_newest_run_checkpoint(LoadedLm& lm, const std::string& run_uri) {
  checkpoint::Checkpointer checkpointer(run_uri, {.read_only = true});
  const auto complete = checkpointer.list_complete();
  TY_CHECK(!complete.empty(), "The run ", run_uri,
           " has no complete checkpoint yet. HINT: train it (trainyard train causal-lm ...) "
           "until it saves one.");
  std::string failures;
  for (auto it = complete.rbegin(); it != complete.rend(); ++it) {
    try {
      load_run_checkpoint(lm, checkpointer, run_uri, *it);
      if (!failures.empty())
        logger("train")->warn("Loaded {}, older than the damaged ones after it.", lm.description);
      return;
    } catch (const CheckpointCorruptError& e) {
      logger("train")->warn("Skipping {} and trying the one before it: {}", *it, e.what());
      failures += detail::concat(failures.empty() ? "" : " ", e.what());
    }
  }
  throw CheckpointCorruptError(detail::concat(
      "No checkpoint of ", run_uri, " loads: ", failures,
      " HINT: a file that fails its SHA-256 was changed after it was saved (a disk or copy "
      "fault): restore the run's checkpoints from a backup, or train it again."));
}

// Refuses an export into a run's folder (its config.json names a recipe, or it holds
// checkpoints) unless overwrite: the export's config.json would replace the run's.
void check_not_a_run_folder(const std::string& out_dir, bool overwrite) {
  std::error_code ec;
  if (overwrite || !fs::is_directory(out_dir, ec)) return;
  bool run = false;
  std::ifstream in(fs::path(out_dir) / "config.json");
  if (in.good()) {
    const auto config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    run = config.is_object() && config.contains("recipe");
  }
  for (const auto& entry : fs::directory_iterator(out_dir, ec))
    run = run || checkpoint::checkpoint_number(entry.path().filename().string()) >= 0;
  TY_CHECK(!run, "The export folder ", out_dir,
           " is a training run's folder (its config.json names a recipe, or it holds "
           "checkpoints): the export would replace the run's config.json. HINT: name a new "
           "folder for the export, or pass --force to write into this one.");
}

// Writes checkpoint `manifest` of the run as a Hugging Face folder, every file verified first.
void export_verified(LoadedLm& lm,
                     checkpoint::Checkpointer& checkpointer,
                     const checkpoint::Manifest& manifest,
                     const std::string& run_uri,
                     const std::string& out_dir,
                     const models::ExportOptions& options) {
  const auto where = storage::join_uri(run_uri, manifest.name);
  lm.description = detail::concat(where, " (step ", manifest.step, ")");
  const auto config_json = lm.model->config().to_json();
  models::TensorShapes tensors;
  for (const auto& p : lm.model->named_parameters())
    tensors.emplace_back(p.key(), p.value().sizes().vec());
  if (manifest.files.count(fsdp::kShardedMetadataFile) != 0) {
    // One parameter at a time from the shards to the export (Note [Reading parameters by ranges]).
    const auto reader = parameter_reader(checkpointer, manifest, where);
    // Every parameter on both sides, of one shape: never a silent subset, never a slice written
    // past a smaller tensor.
    std::set<std::string> model_params;
    for (const auto& [param, shape] : tensors) {
      model_params.insert(param);
      const auto it = reader->shapes().find(param);
      TY_CHECK_T(CheckpointCorruptError, it != reader->shapes().end(), where,
                 " has no parameter \"", param, "\", which the model of the run's config.json has.",
                 " HINT: was it saved from another model?");
      TY_CHECK_T(CheckpointCorruptError, it->second == shape, where, ": parameter \"", param,
                 "\" has shape ", torch::IntArrayRef(it->second), " there but ",
                 torch::IntArrayRef(shape), " in the model of the run's config.json.");
    }
    for (const auto& [param, shape] : reader->shapes())
      TY_CHECK_T(CheckpointCorruptError, model_params.contains(param), where, " holds parameter \"",
                 param,
                 "\", which the model of the run's config.json has not. HINT: was it saved from "
                 "another model?");
    models::export_hf(
        tensors, [&](const std::string& param, float* dst) { reader->read(param, dst); },
        config_json, out_dir, options);
  } else {
    lm = untrained_model_of_run(run_uri, 0);  // DDP's model.pt holds the whole model anyway
    load_run_checkpoint(lm, checkpointer, run_uri, manifest.name);
    models::export_hf(*lm.model, config_json, out_dir, options);
  }
  if (lm.tokenizer.id != "bytes")
    fs::copy_file(lm.tokenizer.id, fs::path(out_dir) / "tokenizer.json",
                  fs::copy_options::overwrite_existing);
}

}  // namespace

LoadedLm load_causal_lm(const std::string& model_or_run, std::uint64_t seed) {
  const auto& presets = models::GptNeoXConfig::preset_names();
  if (std::find(presets.begin(), presets.end(), model_or_run) != presets.end()) {
    check_model_fits(models::GptNeoXConfig::preset(model_or_run), "The preset " + model_or_run);
    return {models::GptNeoX(models::GptNeoXConfig::preset(model_or_run),
                            models::GptNeoXInit{.seed = seed}),
            byte_tokenizer(),
            detail::concat("preset ", model_or_run, " initialised from seed ", seed)};
  }
  const auto config_text = storage::open_storage(model_or_run)->read("config.json");
  TY_CHECK(config_text.has_value(), "--model ", model_or_run,
           " is neither a preset, nor a causal-lm run's folder, nor a Hugging Face model folder "
           "(it has no config.json).");
  // A run's config.json names its recipe; a Hugging Face folder's has no such key.
  const auto config = nlohmann::json::parse(*config_text, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object() || !config.contains("recipe")) {
    // A Hugging Face folder: its config.json, weights and tokenizer.
    const auto source = resolve_model(model_or_run);
    const hf::WeightReader reader(source.dir);
    check_model_fits(source.config, (fs::path(source.dir) / "config.json").string());
    LoadedLm out{models::GptNeoX(source.config, models::GptNeoXInit{.seed = seed}),
                 tokenizer_for(CausalLmOptions{}, source), ""};
    models::load_hf_weights(*out.model, reader);
    out.description =
        detail::concat(source.dir, " (", hf::weight_format_name(reader.format()), ")");
    return out;
  }
  auto lm = untrained_model_of_run(model_or_run, seed);
  load_newest_run_checkpoint(lm, model_or_run);
  return lm;
}

std::string export_checkpoint(const std::string& checkpoint_uri,
                              const std::string& out_dir,
                              const models::ExportOptions& options) {
  auto trimmed = checkpoint_uri;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  const auto slash = trimmed.rfind('/');
  const auto name = slash == std::string::npos ? trimmed : trimmed.substr(slash + 1);
  TY_CHECK(checkpoint::checkpoint_number(name) >= 0, "--checkpoint ", checkpoint_uri,
           " does not name a checkpoint folder (RUN/checkpoint_000003).");
  const auto run_uri = slash == std::string::npos ? std::string(".") : trimmed.substr(0, slash);
  check_not_a_run_folder(out_dir, options.overwrite);
  auto lm = untrained_model_of_run(run_uri, 0, /*deferred=*/true);
  checkpoint::Checkpointer checkpointer(run_uri, {.read_only = true});
  const auto manifest = checkpointer.read_manifest(name);
  const auto where = storage::join_uri(run_uri, manifest.name);
  try {
    export_verified(lm, checkpointer, manifest, run_uri, out_dir, options);
  } catch (const CheckpointCorruptError& e) {
    std::string others;
    for (const auto& n : checkpointer.list_complete())
      if (n != name) others += (others.empty() ? "" : ", ") + n;
    throw CheckpointCorruptError(detail::concat(
        "Cannot export ", where, ": ", e.what(), " HINT: ",
        others.empty() ? "the run has no other complete checkpoint; train it again."
                       : "export another of the run's checkpoints (" + others + ")."));
  }
  return lm.description;
}

void CausalLmOptions::validate() const {
  run.validate();
  scaling.validate();
  TY_CHECK(!data.empty(),
           "--data must name a text file to train on (e.g. "
           "/usr/share/games/fortunes/fortunes, or tiny_shakespeare's input.txt).");
  TY_CHECK(std::find(strategies().begin(), strategies().end(), strategy) != strategies().end(),
           "--strategy must be one of full_shard, shard_grad_op, hybrid_shard, "
           "hybrid_shard_grad_op, no_shard or ddp, got '",
           strategy, "'.");
  TY_CHECK(precision == "bf16-mixed" || precision == "fp32",
           "--precision must be bf16-mixed or fp32, got '", precision, "'.");
  TY_CHECK(!(strategy == "ddp" && activation_checkpointing),
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
  auto& dist = trainer.dist();
  const int rank = trainer.rank();
  const int world = trainer.world_size();
  auto log = logger("train");

  // 1. The model's shape, the tokenizer and the data.
  const auto source = resolve_model(o.model);
  const auto tokenizer = tokenizer_for(o, source);
  TY_CHECK(tokenizer.vocab_size <= source.config.vocab_size, "The tokenizer has ",
           tokenizer.vocab_size, " tokens but --model ", o.model, " embeds only ",
           source.config.vocab_size, ".");
  TY_CHECK(o.seq_len <= source.config.max_position_embeddings, "--seq-len ", o.seq_len,
           " is longer than --model ", o.model, " takes (max_position_embeddings ",
           source.config.max_position_embeddings, ").");
  const auto t_prepare = Clock::now();
  const auto text = data::prepare_text(o.data, tokenizer.cache_key, tokenizer.encode, o.seq_len,
                                       tokenizer.pad_id);
  if (rank == 0)
    log->info("{}: {} training lines, {} tokens ({} {:.2f} s)", o.data, text.lines.size(),
              text.lines.tokens(), text.from_cache ? "read from " : "prepared in",
              std::chrono::duration<double>(Clock::now() - t_prepare).count());
  trainer.write_config(
      config_json(o, source.config, tokenizer, text, world, trainer.threads()).dump());

  // 2. The model, wrapped: one FSDP unit per transformer layer and per embedding (the seed's
  // transformer wrapping policy), or DDP over the whole model.
  const bool ddp_strategy = o.strategy == "ddp";
  const bool bf16 = o.precision == "bf16-mixed";
  // Under FSDP the model is deferred, on any device: FSDP materialises it one unit at a time on
  // FsdpOptions.device (Hugging Face weights read slice by slice); DDP's is built on the device.
  const auto device = trainer.device();
  models::GptNeoX model(source.config,
                        models::GptNeoXInit{.device = ddp_strategy ? device : torch::kCPU,
                                            .seed = o.seed,
                                            .deferred = !ddp_strategy});
  // A Hugging Face folder's weights: FSDP reads each rank's slices of them (Note [Initialising
  // by slices]), DDP the whole model on every rank.
  std::shared_ptr<const hf::WeightReader> weights;
  if (!source.dir.empty()) {
    if (has_hf_weights(source.dir)) {
      weights = std::make_shared<const hf::WeightReader>(source.dir);
      if (rank == 0)
        log->info("Initial weights: {} ({})", source.dir,
                  hf::weight_format_name(weights->format()));
    } else if (rank == 0) {
      log->warn("{} holds config.json but no weights: training from a random initialisation.",
                source.dir);
    }
  }
  if (weights && ddp_strategy) models::load_hf_weights(*model, *weights);
  std::unique_ptr<fsdp::FullyShardedDataParallel<models::GptNeoX>> sharded;
  std::unique_ptr<ddp::DistributedDataParallel<models::GptNeoX>> replicated;
  std::vector<torch::Tensor> params;
  if (ddp_strategy) {
    replicated = std::make_unique<ddp::DistributedDataParallel<models::GptNeoX>>(
        model, dist.process_group());
    params = model->parameters();
  } else {
    fsdp::FsdpOptions options{
        .sharding = fsdp::parse_sharding_strategy(o.strategy),
        .wrap = fsdp::wrap_any_of({fsdp::wrap_modules_of_type<models::GptNeoXLayerImpl>(),
                                   fsdp::wrap_modules_named({"gpt_neox.embed_in", "embed_out"})}),
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
    if (bf16)
      options.mixed_precision = {.param_dtype = torch::kBFloat16, .reduce_dtype = torch::kFloat32};
    const auto t_build = Clock::now();
    sharded = std::make_unique<fsdp::FullyShardedDataParallel<models::GptNeoX>>(
        model, trainer.dist_ptr(), options);
    params = sharded->parameters();
    if (weights)
      log->info("Read this rank's shards of {} in {:.2f} s; peak RSS so far {:.0f} MiB", source.dir,
                std::chrono::duration<double>(Clock::now() - t_build).count(), peak_rss_mib());
  }
  optim::FusedAdamW optimizer(
      params, torch::optim::AdamWOptions(o.lr).eps(o.eps).weight_decay(o.weight_decay));

  // 3. Resume: FSDP's sharded checkpoint every rank writes its part of, or (DDP) rank 0's files.
  std::unique_ptr<CheckpointIO> io;
  if (sharded) {
    io = fsdp_checkpoint_io(*sharded, &optimizer, dist);
  } else {
    io = root_checkpoint_io(
        {.collect =
             [&] {
               std::map<std::string, std::string> files;
               if (rank != 0) return files;
               files["model.pt"] = checkpoint::module_to_bytes(*model);
               files["optimizer.pt"] = checkpoint::optimizer_to_bytes(optimizer);
               return files;
             },
         .restore =
             [&](const checkpoint::LoadedCheckpoint& loaded) {
               const auto where = storage::join_uri(o.run.uri(), loaded.name);
               for (const char* f : {"model.pt", "optimizer.pt"})
                 TY_CHECK_T(CheckpointCorruptError, loaded.checkpoint.files.count(f) != 0, where,
                            " has no ", f, ".");
               checkpoint::load_module(*model, loaded.checkpoint.files.at("model.pt"),
                                       where + "/model.pt");
               checkpoint::load_optimizer(optimizer, loaded.checkpoint.files.at("optimizer.pt"),
                                          where + "/optimizer.pt");
             }},
        dist);
  }
  trainer.resume(*io);

  // 4. Train. DDP's bf16-mixed is autocast; FSDP's is its MixedPrecision.
  nn::set_autocast(device, bf16 && replicated);
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
  double train_time = 0;
  std::int64_t positions = 0;  // this rank's token positions trained, this attempt
  // The same from the second step of this attempt on: the first allocates and warms up.
  double steady_time = 0;
  std::int64_t steady_positions = 0;
  std::int64_t attempt_steps = 0;
  double last_loss = std::nan("");
  int last_epoch = trainer.progress().epoch;
  std::int64_t last_step = -1;  // within its epoch, 0-based, as the seed's table shows it
  bool stop = o.max_steps >= 0 && trainer.progress().global_step >= o.max_steps;
  for (int epoch = trainer.progress().epoch; epoch < o.epochs && !stop; ++epoch) {
    sampler.set_epoch(epoch);
    model->train();
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
      auto logits = sharded ? sharded->forward(batch->inputs) : replicated->forward(batch->inputs);
      auto loss = models::causal_lm_loss(logits, batch->targets);
      at::autocast::clear_cache();
      trainer.phase(Phase::kBackward);
      loss.backward();
      trainer.phase(Phase::kOptimizer);
      optimizer.step();
      trainer.phase(Phase::kOther);
      auto mean = loss.detach().to(torch::kFloat64).reshape({1}) / world;
      trainer.all_reduce(mean);
      last_loss = mean.item<double>();
      positions += batch->inputs.numel();
      const double step_s = std::chrono::duration<double>(Clock::now() - step_start).count();
      if (attempt_steps++ > 0) {
        steady_time += step_s;
        steady_positions += batch->inputs.numel();
      }
      const double tokens_per_s = static_cast<double>(batch->inputs.numel() * world) / step_s;
      last_epoch = epoch;
      last_step = done_before + trainer.epoch_steps();
      trainer.step_done(o.batch_size,
                        {{"train_loss", last_loss}, {"tokens_per_s", tokens_per_s}, {"lr", o.lr}},
                        /*tokens=*/batch->inputs.numel());
      if (rank == 0) {
        if (bar_enabled) {
          bar.update(last_step + 1, last_loss);
        } else {
          std::printf("epoch %d step %lld/%lld: train_loss %.5f, %.0f tokens/s\n", epoch,
                      static_cast<long long>(last_step + 1), static_cast<long long>(epoch_batches),
                      last_loss, tokens_per_s);
          std::fflush(stdout);
        }
      }
      if (o.max_steps >= 0 && trainer.progress().global_step >= o.max_steps) {
        stop = true;
        break;
      }
    }
    train_time += std::chrono::duration<double>(Clock::now() - epoch_start).count();
    if (!stop) trainer.end_epoch();
  }
  const std::string last_checkpoint = trainer.finish_training();

  // 5. The result: throughput over the slowest rank's training time, every rank's peak memory.
  auto slowest = torch::tensor({train_time, steady_time}, torch::kFloat64);
  trainer.all_reduce(slowest, /*max=*/true);
  auto trained = torch::tensor(
      {static_cast<double>(positions), static_cast<double>(steady_positions)}, torch::kFloat64);
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
                .metrics = {{"epoch", double(std::min(last_epoch, o.epochs - 1)), 0}}};
  if (trained_any) {
    result.metrics.push_back({"step", double(last_step), 0});
    result.metrics.push_back({"train_loss", last_loss, 5});
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
    log->info(
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
        last_loss, per_rank.c_str());
    std::fflush(stdout);
  }
  trainer.write_result(result);
  return result;
}

}  // namespace trainyard::train
