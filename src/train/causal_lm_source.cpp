#include "train/causal_lm_source.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "trainyard/checkpoint/checkpointer.h"
#include "trainyard/error.h"
#include "trainyard/hf/tokenizer.h"
#include "trainyard/hf/weight_reader.h"
#include "trainyard/log.h"
#include "trainyard/storage/storage.h"

namespace trainyard::train {
namespace fs = std::filesystem;

namespace {

bool is_remote(const std::string& model) {
  return model.rfind("s3://", 0) == 0;
}

// A local path for "file:///dir" URIs; anything else unchanged.
std::string local_path(const std::string& model) {
  return model.rfind("file://", 0) == 0 ? model.substr(7) : model;
}

}  // namespace

void check_model_flag(const std::string& model) {
  std::error_code ec;
  if (is_remote(model) || fs::is_directory(local_path(model), ec)) return;
  const auto presets = models::CausalLmConfig::preset_names();
  if (std::find(presets.begin(), presets.end(), model) != presets.end()) return;
  std::string known;
  for (const auto& p : presets) known += (known.empty() ? "" : ", ") + p;
  throw InvalidArgumentError(detail::concat("--model ", model,
                                            " is neither a folder holding config.json (a path, "
                                            "file:// or s3:// URI) nor a preset (",
                                            known, ")."));
}

namespace {

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

}  // namespace

// Note [A tied model's written output projection]
// config.json's tie_word_embeddings makes the output projection the input embedding, and
// save_pretrained then writes the embedding alone; some exporters write lm_head.weight as well.
// transformers (5.x) ties the two when the written values are equal and, when they differ, loads
// both and leaves the model untied, with a warning. trainyard reads such a folder the same way:
// equal, the extra tensor is unused (LlamaConfig::is_unused_checkpoint_tensor); different, the
// folder's model is the untied one, and the log says so. Only Llama's family ties (GPT-NeoX
// refuses tie_word_embeddings), hence its tensor names.
namespace {

constexpr const char* kWrittenOutputProjection = "lm_head.weight";
constexpr const char* kInputEmbedding = "model.embed_tokens.weight";

// Whether tensors `a` and `b` of `weights` hold the same shape and values (compared as fp32, a
// piece at a time).
bool same_tensor_values(const hf::WeightReader& weights,
                        const std::string& a,
                        const std::string& b) {
  const auto& info = weights.info(a);
  if (info.shape != weights.info(b).shape) return false;
  constexpr std::uint64_t kPiece = 1 << 20;  // elements
  std::vector<float> x(std::min(kPiece, info.numel())), y(x.size());
  for (std::uint64_t at = 0; at < info.numel(); at += kPiece) {
    const auto n = std::min(kPiece, info.numel() - at);
    weights.read(a, at, n, hf::Dtype::F32, x.data());
    weights.read(b, at, n, hf::Dtype::F32, y.data());
    if (!std::equal(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(n), y.begin())) return false;
  }
  return true;
}

// `config` (read from `text`, the config.json in `dir`) as transformers reads the folder.
models::CausalLmConfig as_written(models::CausalLmConfig config,
                                  const std::string& text,
                                  const std::string& dir) {
  if (!config.parameter_layout().tied || !has_hf_weights(dir)) return config;
  const hf::WeightReader weights(dir);
  if (!weights.contains(kWrittenOutputProjection) || !weights.contains(kInputEmbedding) ||
      same_tensor_values(weights, kWrittenOutputProjection, kInputEmbedding))
    return config;
  logger("train")->warn(
      "{}/config.json says tie_word_embeddings, but its weights hold {} and {} with different "
      "values: reading the model untied, as transformers does (Note [A tied model's written output "
      "projection]). HINT: set \"tie_word_embeddings\": false in config.json to say so.",
      dir, kWrittenOutputProjection, kInputEmbedding);
  auto j = nlohmann::json::parse(text);
  j["tie_word_embeddings"] = false;
  return models::CausalLmConfig::from_json(j.dump());
}

}  // namespace

ModelSource resolve_model(const std::string& model) {
  check_model_flag(model);
  std::error_code ec;
  const std::string dir = is_remote(model) ? cached_model_dir(model) : local_path(model);
  if (!fs::is_directory(dir, ec)) return {models::CausalLmConfig::preset(model), ""};
  const auto path = fs::path(dir) / "config.json";
  std::ifstream in(path);
  TY_CHECK(in.good(), "--model ", model,
           " has no config.json. HINT: a Hugging Face model folder "
           "holds config.json next to its weights.");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    return {as_written(models::CausalLmConfig::from_json(text), text, dir), dir};
  } catch (const Error& e) {
    throw InvalidArgumentError(detail::concat(path.string(), ": ", e.what()));
  }
}

// Note [A LoRA checkpoint's base]
// A LoRA run's checkpoints hold its adapters only (Note [A LoRA run's base]), and adapters mean
// something only over the weights they were trained on: merged onto another model of the same
// shapes, or onto the random weights a folder without weights gives, they make a different model
// without a word. So each checkpoint of such a run holds kLoraBaseFile, the base's fingerprint:
// the --model it names and, for a folder, each of its config.json and weight files (*.safetensors,
// *.bin and their index) with its size and the SHA-256 of samples of it: the first and the last
// MiB and 16 pieces of 64 KiB evenly between. That reads ~3 MiB a file whatever its size, so a
// 10 GB base costs a glance at every start; a safetensors header (every tensor's name, dtype,
// shape and offset) lies in the first MiB, and another model's weights differ throughout. A
// resume, generate and export compare it with the folder as it is now and refuse a base that
// changed or went missing, naming each file. A preset has no files: its seed, which the run's
// config.json records, makes it.
namespace {

bool is_base_file(const std::string& name) {
  return name == "config.json" || name.ends_with(".safetensors") || name.ends_with(".bin") ||
         name.ends_with(".index.json");
}

// The SHA-256 of the size and samples of a file (the Note's).
std::string sampled_sha256(const fs::path& path, std::uintmax_t bytes) {
  constexpr std::uintmax_t kEnd = 1 << 20, kPiece = 64 << 10, kPieces = 16;
  std::ifstream in(path, std::ios::binary);
  TY_CHECK(in.good(), "cannot read ", path.string(), ".");
  std::string samples = std::to_string(bytes) + "\n";
  auto take = [&](std::uintmax_t offset, std::uintmax_t length) {
    length = std::min(length, bytes - std::min(offset, bytes));
    const auto old = samples.size();
    samples.resize(old + length);
    in.seekg(static_cast<std::streamoff>(offset));
    in.read(samples.data() + old, static_cast<std::streamsize>(length));
    TY_CHECK(in.gcount() == static_cast<std::streamsize>(length), "cannot read ", path.string(),
             ": it ended before its size (", bytes, " bytes).");
  };
  if (bytes <= 2 * kEnd + kPieces * kPiece) {
    take(0, bytes);
  } else {
    take(0, kEnd);
    const std::uintmax_t span = bytes - 2 * kEnd - kPiece;
    for (std::uintmax_t i = 0; i < kPieces; ++i) take(kEnd + span * i / (kPieces - 1), kPiece);
    take(bytes - kEnd, kEnd);
  }
  return checkpoint::sha256_hex(samples);
}

}  // namespace

std::string base_fingerprint(const std::string& model, const ModelSource& source) {
  nlohmann::json files = nlohmann::json::object();
  if (!source.dir.empty()) {
    for (const auto& entry : fs::directory_iterator(source.dir)) {
      const auto name = entry.path().filename().string();
      if (!entry.is_regular_file() || !is_base_file(name)) continue;
      const auto bytes = entry.file_size();
      files[name] = {{"bytes", bytes}, {"sampled_sha256", sampled_sha256(entry.path(), bytes)}};
    }
  }
  return nlohmann::json{{"model", model}, {"files", files}}.dump(2) + "\n";
}

void check_same_base(const std::string& recorded,
                     const std::string& now,
                     const std::string& where) {
  nlohmann::json then_json;
  try {
    then_json = nlohmann::json::parse(recorded);
  } catch (const std::exception& e) {
    throw CheckpointCorruptError(
        detail::concat(where, "/", kLoraBaseFile, " is not valid JSON: ", e.what()));
  }
  const auto now_json = nlohmann::json::parse(now);
  const auto& before = then_json.at("files");
  const auto& after = now_json.at("files");
  std::string changes;
  auto add = [&changes](const std::string& change) {
    changes += (changes.empty() ? "" : "; ") + change;
  };
  for (const auto& [name, file] : before.items()) {
    if (!after.contains(name)) {
      add(detail::concat(name, " is gone (", file.at("bytes").get<std::uint64_t>(),
                         " bytes then)"));
    } else if (after[name] != file) {
      add(detail::concat(name, " changed (", file.at("bytes").get<std::uint64_t>(), " bytes then, ",
                         after[name].at("bytes").get<std::uint64_t>(), " now; sampled SHA-256 ",
                         file.at("sampled_sha256").get<std::string>().substr(0, 12), " then, ",
                         after[name].at("sampled_sha256").get<std::string>().substr(0, 12),
                         " now)"));
    }
  }
  for (const auto& [name, file] : after.items())
    if (!before.contains(name)) add(detail::concat(name, " is new"));
  if (changes.empty()) return;
  throw InvalidArgumentError(detail::concat(
      where, " holds LoRA adapters trained on the base model ",
      then_json.value("model", std::string("?")), ", which has changed since: ", changes,
      ". Adapters apply only to the weights they were trained on. HINT: restore that base as it "
      "was, or train new adapters on this one (another --name, or a fresh --storage)."));
}

bool has_hf_weights(const std::string& dir) {
  for (auto name :
       {hf::kSafetensorsName, hf::kSafetensorsIndexName, hf::kTorchBinName, hf::kTorchBinIndexName})
    if (fs::exists(fs::path(dir) / name)) return true;
  return false;
}

TextTokenizer byte_tokenizer() {
  const auto bytes_of = [](std::string_view text) {
    return std::vector<std::int32_t>(
        reinterpret_cast<const unsigned char*>(text.data()),
        reinterpret_cast<const unsigned char*>(text.data()) + text.size());
  };
  return {.id = "bytes",
          .cache_key = "bytes",
          .encode = bytes_of,
          .encode_plain = bytes_of,
          .decode =
              [](const std::vector<std::int64_t>& ids) {
                std::string text;
                for (auto id : ids) text += id >= 0 && id < 256 ? static_cast<char>(id) : '?';
                return text;
              },
          .pad_id = 0,
          .vocab_size = 256,
          .longest_token_bytes = 1};
}

TextTokenizer tokenizer_for(const std::string& tokenizer_flag, const ModelSource& source) {
  std::string path = tokenizer_flag;
  if (path.empty() && !source.dir.empty() && fs::exists(fs::path(source.dir) / "tokenizer.json"))
    path = (fs::path(source.dir) / "tokenizer.json").string();
  return load_text_tokenizer(path.empty() ? "bytes" : path);
}

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
          .encode_plain =
              [tokenizer](std::string_view text) {
                return tokenizer->encode(text, /*add_special_tokens=*/false);
              },
          .decode =
              [tokenizer](const std::vector<std::int64_t>& ids) {
                const std::vector<std::int32_t> narrow(ids.begin(), ids.end());
                return tokenizer->decode(narrow, /*skip_special_tokens=*/true);
              },
          // The seed pads with the end-of-text token when the tokenizer names no padding.
          .pad_id = tokenizer->pad_id().value_or(tokenizer->eos_id().value_or(0)),
          .eos_id = tokenizer->eos_id() ? *tokenizer->eos_id() : -1,
          .bos_id = tokenizer->bos_id() ? *tokenizer->bos_id() : -1,
          .vocab_size = tokenizer->vocab_size(),
          .longest_token_bytes = tokenizer->longest_token_bytes()};
}

}  // namespace trainyard::train
