// Reading a causal-lm run back: its model rebuilt from the run's config.json, the newest (or a
// named) checkpoint verified and loaded into one process for generation, or streamed parameter
// by parameter into a Hugging Face folder for export.
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "train/causal_lm_source.h"
#include "trainyard/checkpoint/checkpointer.h"
#include "trainyard/checkpoint/torch_state.h"
#include "trainyard/cpu_count.h"
#include "trainyard/error.h"
#include "trainyard/fsdp/state_dict.h"
#include "trainyard/hf/weight_reader.h"
#include "trainyard/log.h"
#include "trainyard/models/hf_weights.h"
#include "trainyard/models/lora.h"
#include "trainyard/storage/storage.h"
#include "trainyard/train/causal_lm.h"

namespace trainyard::train {
namespace fs = std::filesystem;

namespace {

// Note [A reader checks the model's size]
// generate and export build a whole model in one process, fp32: parameter_count() x 4 bytes (the
// count the memory planner plans with). Before allocating, that is compared with what the process
// may still take (available_memory_bytes: MemAvailable capped by the cgroup limit), so that a
// config.json describing a model far larger than meant fails at once, naming its size, instead
// of growing until the kernel kills the process. Unknown memory (no /proc) checks nothing.
void check_model_fits(const models::CausalLmConfig& config, const std::string& what) {
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
      what, " describes a ", config.architecture(), " of ", sizes,
      " (MemAvailable, capped by the cgroup memory limit): hidden_size ", config.hidden_size(),
      ", num_hidden_layers ", config.num_hidden_layers(), ", intermediate_size ",
      config.intermediate_size(), ", vocab_size ", config.vocab_size(),
      ". HINT: check those sizes in its config.json, or run on a machine with more memory."));
}

// Note [A LoRA run's base]
// A run trained with --peft lora saves only its adapters and their optimizer state (FSDP's
// checkpoint_frozen false: Note [Frozen shards]); its config.json names the base (--model) and
// the seed it was initialised from. Readers rebuild the base the same way and load the adapters
// over it; export then merges them (W + alpha/r B A) or writes them alone (--adapter-only).

// The LoRA options a run's config.json records ("peft"), or nullopt.
std::optional<models::LoraOptions> lora_of_run(const nlohmann::json& config,
                                               const std::string& run_uri) {
  const auto it = config.find("peft");
  if (it == config.end() || it->is_null()) return std::nullopt;
  try {
    return models::LoraOptions{.r = it->at("r").get<std::int64_t>(),
                               .alpha = it->at("alpha").get<double>(),
                               .dropout = it->at("dropout").get<double>(),
                               .targets = it->at("targets").get<std::vector<std::string>>()};
  } catch (const std::exception& e) {
    throw CorruptDataError(
        detail::concat(run_uri, "/config.json: \"peft\" is not a LoRA configuration: ", e.what()));
  }
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
  const auto model = config.at("model").get<std::string>();
  const auto lora = lora_of_run(config, run_uri);
  const auto source = [&] {
    try {
      return resolve_model(model);
    } catch (const InvalidArgumentError& e) {
      if (!lora) throw;
      throw InvalidArgumentError(detail::concat(
          "The LoRA run ", run_uri, " adapts the base model ", model,
          " (its config.json's \"model\"), which cannot be read: ", e.what(),
          " Its checkpoints hold the adapters only. HINT: restore the base model at ", model, "."));
    }
  }();
  if (lora) {
    // Note [A LoRA run's base]: its checkpoints hold the adapters only; the base is rebuilt as
    // the run built it, from its model folder's weights or its seed, in one whole model.
    deferred = false;
    seed = config.value("seed", std::uint64_t{0});
  }
  // See Note [A reader checks the model's size]; a deferred model allocates nothing.
  if (!deferred) check_model_fits(source.config, run_uri + "'s model " + config.value("model", ""));
  LoadedLm lm{
      models::make_causal_lm(source.config, {.seed = seed, .deferred = deferred, .lora = lora}),
      load_text_tokenizer(config.value("tokenizer", "bytes")), run_uri};
  if (lora && !source.dir.empty() && has_hf_weights(source.dir))
    models::load_hf_weights(*lm.model, hf::WeightReader(source.dir));
  if (lora) lm.lora_base = base_fingerprint(model, source);
  return lm;
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
  if (!lm.lora_base.empty() && manifest.files.count(kLoraBaseFile) != 0)
    check_same_base(checkpointer.read_file(manifest, kLoraBaseFile), lm.lora_base, where);
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
  const auto config_json = lm.model->lm_config().to_json();
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

// A LoRA run's checkpoint (Note [A LoRA run's base]): the adapters alone in PEFT's layout, or
// merged into the base's weights as a plain Hugging Face folder.
void export_lora_run(LoadedLm& lm,
                     checkpoint::Checkpointer& checkpointer,
                     const std::string& run_uri,
                     const std::string& name,
                     const std::string& out_dir,
                     const models::ExportOptions& options) {
  load_run_checkpoint(lm, checkpointer, run_uri, name);
  const auto config = nlohmann::json::parse(*storage::open_storage(run_uri)->read("config.json"));
  if (options.adapter_only) {
    models::export_lora_adapter(*lm.model, *lm.model->lora(), config.value("model", ""), out_dir,
                                options);
    return;
  }
  const auto merged = models::merged_lora_parameters(*lm.model);
  models::TensorShapes tensors;
  std::map<std::string, const torch::Tensor*> by_name;
  for (const auto& [param, t] : merged) {
    tensors.emplace_back(param, t.sizes().vec());
    by_name[param] = &t;
  }
  models::export_hf(
      tensors,
      [&](const std::string& param, float* dst) {
        const auto& t = *by_name.at(param);
        std::copy_n(t.contiguous().data_ptr<float>(), t.numel(), dst);
      },
      lm.model->lm_config().to_json(), out_dir, options);
  if (lm.tokenizer.id != "bytes")
    fs::copy_file(lm.tokenizer.id, fs::path(out_dir) / "tokenizer.json",
                  fs::copy_options::overwrite_existing);
}

}  // namespace

LoadedLm load_causal_lm(const std::string& model_or_run, std::uint64_t seed) {
  if (models::CausalLmConfig::is_preset(model_or_run)) {
    const auto config = models::CausalLmConfig::preset(model_or_run);
    check_model_fits(config, "The preset " + model_or_run);
    return {models::make_causal_lm(config, {.seed = seed}), byte_tokenizer(),
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
    LoadedLm out{models::make_causal_lm(source.config, {.seed = seed}), tokenizer_for("", source),
                 ""};
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
  TY_CHECK(!out_dir.empty(), "--out is empty. HINT: name the folder to write the export into.");
  check_not_a_run_folder(out_dir, options.overwrite);
  auto lm = untrained_model_of_run(run_uri, 0, /*deferred=*/true);
  checkpoint::Checkpointer checkpointer(run_uri, {.read_only = true});
  const auto complete = checkpointer.list_complete();
  if (std::find(complete.begin(), complete.end(), name) == complete.end()) {
    std::string names;
    for (const auto& n : complete) names += (names.empty() ? "" : ", ") + n;
    throw InvalidArgumentError(detail::concat(
        "--checkpoint ", checkpoint_uri, " is not a complete checkpoint of ", run_uri,
        " (never saved, unfinished, damaged, or removed by retention: --num-to-keep). HINT: ",
        names.empty() ? std::string("the run has no complete checkpoint yet.")
                      : "export one of its complete checkpoints: " + names + "."));
  }
  const auto manifest = checkpointer.read_manifest(name);
  const auto where = storage::join_uri(run_uri, manifest.name);
  TY_CHECK(!options.adapter_only || lm.model->lora(),
           "--adapter-only exports LoRA adapters, "
           "but ",
           run_uri,
           " was trained without --peft lora. HINT: export it without "
           "--adapter-only.");
  try {
    if (lm.model->lora())
      export_lora_run(lm, checkpointer, run_uri, name, out_dir, options);
    else
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

}  // namespace trainyard::train
