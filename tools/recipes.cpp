// The registry of built-in recipes and their own flags (the shared RunConfig / ScalingConfig
// flags are train_command.cpp's); the recipes themselves are the library's (trainyard/train/).
#include <CLI/CLI.hpp>

#include "tools/recipe.h"
#include "trainyard/data/fashion_mnist.h"
#include "trainyard/data/instruction_data.h"
#include "trainyard/env.h"
#include "trainyard/models/causal_lm_config.h"
#include "trainyard/models/image_model.h"
#include "trainyard/models/lora.h"
#include "trainyard/train/causal_lm.h"
#include "trainyard/train/fashion_mnist.h"
#include "trainyard/train/image_folder_recipe.h"

namespace trainyard::cli {
using namespace trainyard::train;
namespace {

// A recipe over an options struct holding `run`, `scaling` and `progress` besides its own fields.
template <typename Options>
class RecipeOf : public Recipe {
 public:
  RecipeOf() {
    run = options_.run;
    scaling = options_.scaling;
  }
  void validate() const override { resolved().validate(); }

 protected:
  // The recipe's options with the shared flags' values.
  Options resolved() const {
    auto o = options_;
    o.run = run;
    o.scaling = scaling;
    o.progress = progress;
    return o;
  }
  Options options_;
};

class FashionMnistRecipe final : public RecipeOf<FashionMnistOptions> {
 public:
  std::string name() const override { return "fashion-mnist"; }
  std::string summary() const override {
    return "ResNet18 on FashionMNIST with DistributedDataParallel (the seed's Ray Train job). Run "
           "bare it starts --workers local ranks itself; under `trainyard run` it is one rank of "
           "that job.";
  }
  void add_flags(CLI::App& c) override {
    c.add_option("--epochs", options_.epochs, "Passes over the training set")
        ->capture_default_str();
    c.add_option("--batch-size", options_.batch_size, "Batch size per rank")->capture_default_str();
    c.add_option("--lr", options_.lr, "Adam learning rate")->capture_default_str();
    c.add_option("--limit", options_.limit, "Use the first N training images (-1: all)")
        ->capture_default_str();
    c.add_option("--test-limit", options_.test_limit,
                 "Evaluate on the first N test images (-1: all 10,000)")
        ->envname(kTestLimitEnv)
        ->capture_default_str();
    c.add_option("--bucket-cap-mb", options_.bucket_cap_mb, "DDP gradient bucket size in MiB")
        ->capture_default_str();
    c.add_option("--seed", options_.seed, "Seed for initialisation and shuffling")
        ->capture_default_str();
    c.add_option("--data-dir", options_.data_dir, "Folder with the FashionMNIST IDX files")
        ->default_str(data::kFashionMnistDir);
  }
  void run_rank() override { run_fashion_mnist_rank(resolved()); }
};

class ImageFolderRecipe final : public RecipeOf<ImageFolderRecipeOptions> {
 public:
  std::string name() const override { return "image-folder"; }
  std::string summary() const override {
    return "A torchvision image classifier (ResNet, EfficientNet) on DIR/train and DIR/val in "
           "ImageFolder layout, as ImageNet is arranged, with DistributedDataParallel and top-1 / "
           "top-5 accuracy on val/ after each epoch. Run bare it starts --workers local ranks "
           "itself; under `trainyard run` it is one rank of that job.";
  }
  void add_flags(CLI::App& c) override {
    std::string models;
    for (const auto& m : models::image_model_names()) models += (models.empty() ? "" : ", ") + m;
    c.add_option("--data", options_.data,
                 "The folder holding train/ and val/, each with one folder of images per class");
    c.add_option("--model", options_.model, "The model: " + models)->capture_default_str();
    c.add_option("--image-size", options_.image_size,
                 "Side of the training and evaluation crops, pixels (eval resizes to "
                 "size * 256 / 224 first)")
        ->capture_default_str();
    c.add_option("--loader-threads", options_.loader_threads, "Image decoding threads per rank")
        ->capture_default_str();
    c.add_flag("--strict", options_.strict,
               "Stop at an image that cannot be decoded instead of skipping it");
    c.add_option("--epochs", options_.epochs, "Passes over train/")->capture_default_str();
    c.add_option("--batch-size", options_.batch_size, "Batch size per rank")->capture_default_str();
    c.add_option("--lr", options_.lr, "Adam learning rate")->capture_default_str();
    c.add_option("--limit", options_.limit, "Train on N images spread evenly over train/ (-1: all)")
        ->capture_default_str();
    c.add_option("--val-limit", options_.val_limit,
                 "Evaluate on N images spread evenly over val/ (-1: all)")
        ->capture_default_str();
    c.add_option("--bucket-cap-mb", options_.bucket_cap_mb, "DDP gradient bucket size in MiB")
        ->capture_default_str();
    c.add_option("--seed", options_.seed, "Seed for initialisation, shuffling and augmentation")
        ->capture_default_str();
  }
  void run_rank() override { run_image_folder_rank(resolved()); }
};

class CausalLmRecipe final : public RecipeOf<CausalLmOptions> {
 public:
  std::string name() const override { return "causal-lm"; }
  std::string summary() const override {
    return "Fine-tunes a causal LM (GPT-NeoX, Llama, Mistral, Qwen2) with FSDP on a text corpus "
           "(seed 000's dolly-v2 on tiny_shakespeare) or on instruction records as llama-recipes "
           "does (seed 002's Llama 2 on samsum). Run bare it starts --workers local ranks itself; "
           "under "
           "`trainyard "
           "run` it is one rank of that job.";
  }
  void add_flags(CLI::App& c) override {
    std::string presets;
    for (const auto& p : models::CausalLmConfig::preset_names())
      presets += (presets.empty() ? "" : ", ") + p;
    c.add_option("--model", options_.model,
                 "A preset (" + presets + ") or a Hugging Face model folder")
        ->capture_default_str();
    c.add_option("--data", options_.data,
                 "The training data: a text corpus (one training line per line), or records "
                 "(JSON array or JSON lines) for --data-format samsum, alpaca or jsonl")
        ->required();
    c.add_option_function<std::string>(
         "--data-format",
         [this](const std::string& name) { options_.data_format = data::parse_data_format(name); },
         "text (one line per example, the seed's tiny_shakespeare), samsum (dialogue, summary), "
         "alpaca (instruction, input, output) or jsonl (--prompt-template, --response-field); "
         "records are BOS + prompt + response + EOS with the prompt masked out of the loss")
        ->default_str("text");
    c.add_option("--prompt-template", options_.prompt_template,
                 "jsonl: the prompt, with {field} for a record's fields");
    c.add_option("--response-field", options_.response_field, "jsonl: the response's field");
    c.add_option_function<std::string>(
         "--batching",
         [this](const std::string& name) {
           options_.batching = name == "padding" ? CausalLmOptions::Batching::kPadding
                                                 : CausalLmOptions::Batching::kPacking;
         },
         "Records: packing (end to end in --seq-len rows) or padding (length-grouped batches)")
        ->check(CLI::IsMember({"packing", "padding"}))
        ->default_str("packing");
    c.add_option("--val-data", options_.val_data,
                 "Validation data of --data-format's kind: eval loss and perplexity per epoch");
    c.add_option("--val-fraction", options_.val_fraction,
                 "Hold out this share of --data for validation instead of --val-data");
    c.add_option("--tokenizer", options_.tokenizer,
                 "tokenizer.json (default: the model folder's; else bytes are the tokens)");
    c.add_option_function<std::string>(
         "--strategy",
         [this](const std::string& name) {
           options_.strategy = parse_strategy(name, kTrainingStrategies);
         },
         strategy_names(kTrainingStrategies))
        ->default_str(std::string(to_string(options_.strategy)));
    auto* precision =
        c.add_option_function<std::string>(
             "--precision",
             [this](const std::string& text) { options_.precision = parse_precision(text); },
             "bf16-mixed (bf16 compute, fp32 master weights and AdamW state), fp32, or pure-bf16")
            ->default_str(std::string(to_string(options_.precision)));
    c.add_flag_callback(
         "--pure-bf16", [this] { options_.precision = Precision::kPureBf16; },
         "bf16 parameters, gradients and AdamW state, no fp32 master copy (llama-recipes' "
         "--pure_bf16; FSDP strategies only); the same as --precision pure-bf16")
        ->excludes(precision);
    c.add_flag("--activation-checkpointing", options_.activation_checkpointing,
               "Recompute each transformer layer in backward instead of keeping its activations");
    c.add_option("--seq-len", options_.seq_len, "Tokens per line (truncated or padded)")
        ->capture_default_str();
    c.add_option("--batch-size", options_.batch_size, "Lines per rank and step")
        ->capture_default_str();
    c.add_option("--epochs", options_.epochs, "Passes over the corpus")->capture_default_str();
    c.add_option("--max-steps", options_.max_steps,
                 "Stop after this many steps of the run (-1: all epochs)")
        ->capture_default_str();
    c.add_option_function<double>(
        "--lr", [this](double lr) { options_.lr = lr; },
        "AdamW learning rate (default: 2e-5 for text, llama-recipes' 1e-4 for records)");
    c.add_option_function<double>(
        "--gamma", [this](double gamma) { options_.gamma = gamma; },
        "StepLR: multiply the learning rate by this after every epoch (default: 1 for text, "
        "llama-recipes' 0.85 for records)");
    c.add_option("--gradient-accumulation-steps", options_.gradient_accumulation_steps,
                 "Micro-batches of --batch-size per optimizer step")
        ->capture_default_str();
    c.add_option("--eps", options_.eps, "AdamW epsilon")->capture_default_str();
    c.add_option_function<std::string>(
         "--peft",
         [this](const std::string&) {
           if (!options_.lora) options_.lora = models::LoraOptions{};
         },
         "lora: train LoRA adapters on --lora-targets, the base model frozen")
        ->check(CLI::IsMember({"lora"}));
    // The LoRA flags apply to the options once parsing is done (any order).
    lora_flags_ = {
        c.add_option("--lora-r", lora_.r, "LoRA rank")->capture_default_str(),
        c.add_option("--lora-alpha", lora_.alpha, "LoRA alpha (the update is scaled by alpha / r)")
            ->capture_default_str(),
        c.add_option("--lora-dropout", lora_.dropout, "Dropout on the LoRA adapters' input")
            ->capture_default_str(),
        c.add_option("--lora-targets", lora_.targets,
                     "Linear layers to adapt, by name (q_proj,v_proj; query_key_value for "
                     "GPT-NeoX), or all-linear")
            ->delimiter(',')
            ->capture_default_str()};
    c.add_option("--weight-decay", options_.weight_decay, "AdamW decoupled weight decay")
        ->capture_default_str();
    c.add_option("--seed", options_.seed, "Seed for initialisation and shuffling")
        ->capture_default_str();
  }
  void validate() const override {
    // A LoRA flag without --peft lora would be ignored and a full fine-tune run.
    for (const auto* flag : lora_flags_)
      TY_CHECK(options_.lora || flag->count() == 0, flag->get_name(),
               " applies to LoRA adapters, but --peft lora is not given: the run would be a full "
               "fine-tune. HINT: add --peft lora, or drop ",
               flag->get_name(), ".");
    with_lora().validate();
  }
  void run_rank() override { run_causal_lm_rank(with_lora()); }

 private:
  CausalLmOptions with_lora() const {
    auto o = resolved();
    if (o.lora) o.lora = lora_;
    return o;
  }
  models::LoraOptions lora_;
  std::vector<const CLI::Option*> lora_flags_;
};

}  // namespace

std::vector<std::unique_ptr<Recipe>> builtin_recipes() {
  std::vector<std::unique_ptr<Recipe>> out;
  out.push_back(std::make_unique<FashionMnistRecipe>());
  out.push_back(std::make_unique<ImageFolderRecipe>());
  out.push_back(std::make_unique<CausalLmRecipe>());
  return out;
}

}  // namespace trainyard::cli
