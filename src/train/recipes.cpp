// The registry of built-in recipes and their own flags (the shared RunConfig / ScalingConfig
// flags are the CLI's: tools/train_command.cpp).
#include <CLI/CLI.hpp>

#include "trainyard/data/fashion_mnist.h"
#include "trainyard/train/fashion_mnist.h"
#include "trainyard/train/recipe.h"

namespace trainyard::train {
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
    c.add_option("--bucket-cap-mb", options_.bucket_cap_mb, "DDP gradient bucket size in MiB")
        ->capture_default_str();
    c.add_option("--seed", options_.seed, "Seed for initialisation and shuffling")
        ->capture_default_str();
    c.add_option("--data-dir", options_.data_dir, "Folder with the FashionMNIST IDX files")
        ->default_str(data::kFashionMnistDir);
  }
  void run_rank() override { run_fashion_mnist_rank(resolved()); }
};

}  // namespace

std::vector<std::unique_ptr<Recipe>> builtin_recipes() {
  std::vector<std::unique_ptr<Recipe>> out;
  out.push_back(std::make_unique<FashionMnistRecipe>());
  return out;
}

}  // namespace trainyard::train
