#include "trainyard/models/hf_weights.h"

#include <torch/torch.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <string_view>

#include <nlohmann/json.hpp>

#include "hf/file_io.h"
#include "trainyard/checkpoint/safetensors.h"
#include "trainyard/error.h"
#include "trainyard/hf/safetensors_writer.h"
#include "trainyard/hf/weight_reader.h"
#include "trainyard/models/causal_lm.h"
#include "trainyard/models/lora.h"

namespace trainyard::models {

void check_hf_tensor_names(const CausalLmConfig& config,
                           const std::vector<std::string>& model_names,
                           const hf::WeightReader& reader) {
  const std::set<std::string> wanted(model_names.begin(), model_names.end());
  std::vector<std::string> missing, unexpected;
  for (const auto& name : model_names)
    if (!reader.contains(name)) missing.push_back(name);
  for (const auto& name : reader.names())
    if (!wanted.contains(name) && !config.is_unused_checkpoint_tensor(name))
      unexpected.push_back(name);
  if (missing.empty() && unexpected.empty()) return;
  // At most this many names of each kind in the message, then a count.
  constexpr std::size_t kNamesShown = 8;
  auto list = [](const std::vector<std::string>& names) {
    std::string out;
    for (std::size_t i = 0; i < names.size() && i < kNamesShown; ++i)
      out += (i == 0 ? "\"" : ", \"") + names[i] + "\"";
    if (names.size() > kNamesShown)
      out += detail::concat(" and ", names.size() - kNamesShown, " more");
    return out;
  };
  std::string what;
  if (!missing.empty())
    what += detail::concat(" It lacks ", missing.size(), " tensor", missing.size() == 1 ? "" : "s",
                           " the model needs: ", list(missing), ".");
  if (!unexpected.empty())
    what += detail::concat(" It holds ", unexpected.size(), " tensor",
                           unexpected.size() == 1 ? "" : "s",
                           " the model does not have: ", list(unexpected), ".");
  throw CheckpointCorruptError(detail::concat(
      reader.dir().string(), "'s weights do not match the model its config.json describes.", what,
      " HINT: the weights and config.json belong to different models (or config.json has fewer "
      "layers than the weights); use the config.json saved with these weights."));
}

void load_hf_weights(CausalLmImpl& model, const hf::WeightReader& reader) {
  std::vector<std::string> names;
  for (const auto& p : model.named_parameters())
    if (!is_lora_parameter(p.key())) names.push_back(p.key());
  check_hf_tensor_names(model.lm_config(), names, reader);
  torch::NoGradGuard no_grad;
  for (auto& p : model.named_parameters()) {
    if (is_lora_parameter(p.key())) continue;  // the adapters keep their initial values
    auto& t = p.value();
    TY_CHECK_T(CheckpointCorruptError, reader.contains(p.key()), reader.dir().string(),
               " has no tensor \"", p.key(), "\" that the model needs.");
    reader.check_shape(p.key(), t.sizes().vec(), "the model's config.json");
    auto values = torch::empty({t.numel()}, torch::kFloat32);
    reader.read(p.key(), 0, static_cast<std::uint64_t>(t.numel()), hf::Dtype::F32,
                values.data_ptr<float>());
    t.copy_(values.view(t.sizes()));
  }
}

std::function<void(const std::string&, std::int64_t, std::int64_t, float*)> hf_slice_init(
    std::shared_ptr<const hf::WeightReader> reader,
    std::function<std::vector<std::int64_t>(const std::string&)> shapes) {
  auto checked = std::make_shared<std::set<std::string>>();
  auto mu = std::make_shared<std::mutex>();
  return [reader, shapes, checked, mu](const std::string& name, std::int64_t begin,
                                       std::int64_t count, float* dst) {
    {
      std::lock_guard<std::mutex> lock(*mu);
      if (checked->insert(name).second) {
        TY_CHECK_T(CheckpointCorruptError, reader->contains(name), reader->dir().string(),
                   " has no tensor \"", name, "\" that the model needs.");
        reader->check_shape(name, shapes(name), "the model's config.json");
      }
    }
    reader->read(name, static_cast<std::uint64_t>(begin), static_cast<std::uint64_t>(count),
                 hf::Dtype::F32, dst);
  };
}

namespace {

void check_existing_export_folder(const std::string& dir, bool overwrite);

// Makes the export folder, or refuses it before anything is written: an empty name, a file, a
// folder that holds files (unless overwrite), or one that cannot be made or written (/proc, a
// read-only mount).
void prepare_export_folder(const std::string& dir, bool overwrite) {
  namespace fs = std::filesystem;
  TY_CHECK(!dir.empty(),
           "The export folder's name is empty. HINT: name the folder to write the "
           "export into (--out).");
  check_existing_export_folder(dir, overwrite);
  std::error_code ec;
  fs::create_directories(dir, ec);
  TY_CHECK(!ec, "Cannot make the export folder ", dir, ": ", ec.message(),
           ". HINT: name a folder you can write (--out).");
  const auto probe = fs::path(dir) / ".trainyard-export-probe";
  bool writable = false;
  int error = 0;
  {
    std::ofstream out(probe);
    writable = out.good();
    error = errno;
  }
  fs::remove(probe, ec);
  TY_CHECK(writable, "Cannot write into the export folder ", dir, ": ", std::strerror(error),
           ". HINT: name a folder you can write (--out).");
}

void check_existing_export_folder(const std::string& dir, bool overwrite) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto status = fs::status(dir, ec);
  if (!fs::exists(status)) return;
  TY_CHECK(fs::is_directory(status), "The export folder ", dir,
           " is an existing file, not a folder. HINT: name a new folder; the export writes "
           "config.json and the weights into it.");
  if (overwrite) return;
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    names.push_back(entry.path().filename().string());
    if (names.size() == 4) break;
  }
  TY_CHECK(
      names.empty(), "The export folder ", dir, " is not empty (it holds ",
      [&] {
        std::string out;
        for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
        return out + (names.size() == 4 ? ", ..." : "");
      }(),
      "): the export would write over its files. HINT: name a new or empty folder, or pass "
      "--force to write into this one.");
}

}  // namespace

void export_hf(const TensorShapes& tensors,
               const std::function<void(const std::string&, float*)>& fill,
               const std::string& config_json,
               const std::string& dir,
               ExportOptions options) {
  prepare_export_folder(dir, options.overwrite);
  std::vector<hf::TensorSpec> specs;
  for (const auto& [name, shape] : tensors)
    specs.push_back({name, options.bf16 ? hf::Dtype::BF16 : hf::Dtype::F32, shape});
  hf::ShardedSafetensorsWriter writer(dir, specs, {.max_shard_bytes = options.max_shard_bytes});
  std::vector<float> values;
  for (const auto& spec : specs) {
    values.resize(spec.numel());
    fill(spec.name, values.data());
    writer.append(values.data(), hf::Dtype::F32, spec.numel());
  }
  writer.finish();
  hf::write_config_json(dir, config_json);
}

void export_hf(const torch::nn::Module& module,
               const std::string& config_json,
               const std::string& dir,
               ExportOptions options) {
  const auto params = module.named_parameters();
  TensorShapes tensors;
  for (const auto& p : params) tensors.emplace_back(p.key(), p.value().sizes().vec());
  export_hf(
      tensors,
      [&](const std::string& name, float* dst) {
        const auto values = params[name].detach().to(torch::kFloat32).contiguous();
        std::copy_n(values.data_ptr<float>(), values.numel(), dst);
      },
      config_json, dir, options);
}

void export_lora_adapter(const torch::nn::Module& module,
                         const LoraOptions& lora,
                         const std::string& base_model,
                         const std::string& dir,
                         ExportOptions options) {
  prepare_export_folder(dir, options.overwrite);
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  std::set<std::string> modules;  // PEFT's target_modules: the adapted layers' names
  for (const auto& p : module.named_parameters()) {
    if (!is_lora_parameter(p.key())) continue;
    tensors.emplace_back("base_model.model." + p.key(),
                         p.value().detach().to(torch::kFloat32).contiguous());
    const auto layer = p.key().substr(0, p.key().rfind(".lora_"));
    modules.insert(layer.substr(layer.rfind('.') + 1));
  }
  TY_CHECK(!tensors.empty(),
           "The model has no LoRA adapter to export. HINT: export it without "
           "--adapter-only.");
  const nlohmann::json config = {{"peft_type", "LORA"},
                                 {"task_type", "CAUSAL_LM"},
                                 {"base_model_name_or_path", base_model},
                                 {"r", lora.r},
                                 {"lora_alpha", lora.alpha},
                                 {"lora_dropout", lora.dropout},
                                 {"target_modules", modules},  // all-linear spelled out
                                 {"bias", "none"},
                                 {"fan_in_fan_out", false},
                                 {"inference_mode", true},
                                 {"modules_to_save", nullptr}};
  hf::detail::write_file_atomically(std::filesystem::path(dir) / "adapter_model.safetensors",
                                    checkpoint::encode_safetensors(tensors, {{"format", "pt"}}));
  hf::detail::write_file_atomically(std::filesystem::path(dir) / "adapter_config.json",
                                    config.dump(2));
}

}  // namespace trainyard::models
