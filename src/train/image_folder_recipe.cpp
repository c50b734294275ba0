#include "trainyard/train/image_folder_recipe.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <optional>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "train/classifier_training.h"
#include "train/ddp_classifier.h"
#include "trainyard/blas_core.h"
#include "trainyard/comm/process_group.h"
#include "trainyard/data/distributed_sampler.h"
#include "trainyard/data/image_folder.h"
#include "trainyard/ddp/distributed_data_parallel.h"
#include "trainyard/error.h"
#include "trainyard/heartbeat.h"
#include "trainyard/log.h"
#include "trainyard/models/image_model.h"
#include "trainyard/optim/sharded_adam.h"
#include "trainyard/train/trainer.h"

namespace trainyard::train {

namespace {
namespace fs = std::filesystem;

constexpr const char* kTrainFolder = "train";
constexpr const char* kValFolder = "val";
constexpr std::int64_t kTopK = 5;

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

// Positions into a split of `size` samples: all of them, or `limit` spread evenly over the split
// (floor(i * size / limit)), so that a limited run still sees every class of a folder whose
// samples are sorted by class.
std::vector<std::int64_t> subset(std::int64_t size, std::int64_t limit) {
  const std::int64_t n = limit < 0 ? size : std::min(size, limit);
  std::vector<std::int64_t> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = i * size / n;
  return out;
}

// Names the classes one folder has and the other lacks.
std::string class_difference(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  std::vector<std::string> only;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(only));
  if (only.size() > 10) {
    const auto more = only.size() - 10;
    only.resize(10);
    only.push_back(detail::concat("and ", more, " more"));
  }
  return only.empty() ? std::string("none") : joined(only);
}

nlohmann::ordered_json config_json(const ImageFolderRecipeOptions& o,
                                   int world_size,
                                   int threads,
                                   const data::ImageFolder& train_set,
                                   const data::ImageFolder& val_set,
                                   std::int64_t train_images,
                                   std::int64_t val_images) {
  return {
      {"recipe", "image-folder"},
      {"model", o.model},
      {"data", o.data},
      {"num_classes", train_set.classes().size()},
      {"train_images", train_images},
      {"train_images_in_folder", train_set.size()},
      {"val_images", val_images},
      {"val_images_in_folder", val_set.size()},
      {"image_size", o.image_size},
      {"eval_resize_size", data::ImageTransformOptions{.size = o.image_size}.eval_resize_size()},
      {"world_size", world_size},
      {"epochs", o.epochs},
      {"batch_size", o.batch_size},
      {"lr", o.lr},
      {"optimizer", "Adam (ShardedAdam: ZeRO-1 across the ranks)"},
      {"blas_core", blas_core_name()},
      {"limit", o.limit},
      {"val_limit", o.val_limit},
      {"loader_threads", o.loader_threads},
      {"strict", o.strict},
      {"threads_per_rank", threads},
      {"seed", o.seed},
      {"bucket_cap_mb", o.bucket_cap_mb},
      {"storage", o.run.storage},
      {"name", o.run.name},
      {"checkpoint_every", o.run.checkpoint_every},
      {"num_to_keep", o.run.num_to_keep},
      {"collective_timeout_s", static_cast<double>(o.run.collective_timeout.count()) / 1000}};
}

// One evaluation on val/, the same on every rank.
struct Evaluation {
  double loss = 0;           // mean cross-entropy
  double accuracy = 0;       // top-1
  double top5_accuracy = 0;  // top-k with k = min(5, classes): see Note [Top-5 with few classes]
  std::int64_t images = 0;
};

// Note [Top-5 with few classes]
// top5_accuracy is the fraction of images whose label is among the model's k highest logits, with
// k = min(5, number of classes). With fewer than five classes k is the number of classes, so it is
// 1 by definition: reported as such rather than left out, so that result.json always has the key.

// Collective. Rank r evaluates the val positions r, r + W, ... with the eval transform on the
// trainer's device; the sums are all-reduced (as CPU tensors), so every image counts exactly once
// and every rank returns the same numbers. The caller has made every rank's BatchNorm statistics
// rank 0's (sync_buffers).
Evaluation evaluate(models::ImageModel& model,
                    const data::ImageFolder& val_set,
                    const std::vector<std::int64_t>& val_positions,
                    const ImageFolderRecipeOptions& o,
                    Trainer& trainer) {
  const int rank = trainer.rank();
  const int world = trainer.world_size();
  const auto device = trainer.device();
  const std::int64_t k =
      std::min<std::int64_t>(kTopK, static_cast<std::int64_t>(val_set.classes().size()));
  std::vector<std::int64_t> mine;
  for (std::size_t i = rank; i < val_positions.size(); i += world) mine.push_back(val_positions[i]);
  const auto images = static_cast<double>(mine.size());
  double loss_sum = 0, top1 = 0, topk = 0;
  model.eval();
  {
    torch::NoGradGuard no_grad;
    data::ImageFolderLoader loader(
        val_set, std::move(mine),
        {.batch_size = o.batch_size,
         .threads = o.loader_threads,
         .transform = {.kind = data::ImageTransform::kEval, .size = o.image_size},
         .seed = o.seed});
    while (auto batch = loader.next()) {
      auto logits = model.forward(batch->inputs.to(device));  // (B, classes)
      const auto y = batch->targets.to(device);               // (B,)
      loss_sum += torch::cross_entropy_loss(logits, y, {}, torch::Reduction::Sum).item<double>();
      top1 += logits.argmax(1).eq(y).sum().item<double>();
      auto best = std::get<1>(logits.topk(k, /*dim=*/1));  // (B, k)
      topk += best.eq(y.unsqueeze(1)).any(1).sum().item<double>();
      heartbeat();
    }
  }
  // (4,): loss sum, top-1 hits, top-k hits, images; summed over ranks.
  auto totals = torch::tensor({loss_sum, top1, topk, images}, torch::kFloat64);
  trainer.all_reduce(totals);
  const double n = totals[3].item<double>();
  return {.loss = totals[0].item<double>() / n,
          .accuracy = totals[1].item<double>() / n,
          .top5_accuracy = totals[2].item<double>() / n,
          .images = static_cast<std::int64_t>(n)};
}

// Images that could not be decoded, over both folders and all ranks of this attempt.
struct SkippedImages {
  std::int64_t skipped = 0;        // samples replaced, summed over the ranks
  std::int64_t corrupt_files = 0;  // see Note [Counting corrupt files]
};

// Note [Counting corrupt files]
// Each rank has its own ImageFolders and finds the undecodable files among the samples it loads;
// the ranks do not tell each other which files those were. `skipped` (samples replaced) is summed
// over the ranks and exact; `corrupt_files` is the most distinct files any one rank found, a lower
// bound on their number (exact when one rank has loaded every sample, or there is one bad file).

// Collective.
SkippedImages skipped_images(const data::ImageFolder& train_set,
                             const data::ImageFolder& val_set,
                             Trainer& trainer) {
  const auto a = train_set.stats();
  const auto b = val_set.stats();
  auto skipped = torch::tensor({static_cast<double>(a.skipped + b.skipped)}, torch::kFloat64);
  auto corrupt =
      torch::tensor({static_cast<double>(a.corrupt_files + b.corrupt_files)}, torch::kFloat64);
  trainer.all_reduce(skipped);
  trainer.all_reduce(corrupt, /*max=*/true);
  return {.skipped = static_cast<std::int64_t>(skipped.item<double>()),
          .corrupt_files = static_cast<std::int64_t>(corrupt.item<double>())};
}

// Both folders, which every rank scans, and the positions into each that the run uses (all, or
// --limit / --val-limit of them). The classes are indexed in sorted name order, so val/ must have
// exactly train/'s classes for its labels to mean the same.
struct Splits {
  data::ImageFolder train;
  data::ImageFolder val;
  std::vector<std::int64_t> train_positions;
  std::vector<std::int64_t> val_positions;
};

Splits open_splits(const ImageFolderRecipeOptions& o, int rank) {
  const data::ImageFolderOptions folder_options{.strict = o.strict};
  data::ImageFolder train((fs::path(o.data) / kTrainFolder).string(), folder_options);
  data::ImageFolder val((fs::path(o.data) / kValFolder).string(), folder_options);
  TY_CHECK(val.classes() == train.classes(), "The class folders of ", val.root(), " (",
           val.classes().size(), ") are not those of ", train.root(), " (", train.classes().size(),
           "): only in train/: ", class_difference(train.classes(), val.classes()),
           "; only in val/: ", class_difference(val.classes(), train.classes()),
           ". HINT: both need the same class folders, or the labels would not match.");
  auto train_positions = subset(train.size(), o.limit);
  auto val_positions = subset(val.size(), o.val_limit);
  if (rank == 0)
    logger("train")->info(
        "{}: {} classes, {} training images ({} used), {} validation images ({} used)", o.data,
        train.classes().size(), train.size(), train_positions.size(), val.size(),
        val_positions.size());
  return {.train = std::move(train),
          .val = std::move(val),
          .train_positions = std::move(train_positions),
          .val_positions = std::move(val_positions)};
}

// Note [Full training batches]
// Each rank drops its epoch's last batch when it is smaller than --batch-size (at most
// batch_size - 1 of its images; a different few each epoch, as the permutation changes). A batch
// of one image cannot train BatchNorm where the feature map is 1x1 (ResNet's last stage at
// --image-size 32 and below), and every step then averages the same number of images. The
// DistributedSampler gives every rank the same count, so the ranks still take the same steps.

}  // namespace

void ImageFolderRecipeOptions::validate() const {
  run.validate();
  scaling.validate();
  const std::string layout_hint =
      " HINT: --data is a folder holding train/ and val/, each with one folder per class "
      "holding its images (.jpg, .jpeg, .png), as torchvision's ImageFolder reads ImageNet.";
  TY_CHECK(!data.empty(), "--data is required: the folder holding train/ and val/.", layout_hint);
  std::error_code ec;
  TY_CHECK(fs::is_directory(data, ec), "--data ", data,
           fs::exists(data, ec) ? " is not a folder." : " does not exist.", layout_hint);
  for (const char* split : {kTrainFolder, kValFolder}) {
    const auto path = (fs::path(data) / split).string();
    TY_CHECK(fs::is_directory(path, ec), "--data ", data, " has no ", split, "/ folder: ", path,
             fs::exists(path, ec) ? " is not a folder." : " does not exist.", layout_hint);
  }
  const auto& names = models::image_model_names();
  TY_CHECK(std::find(names.begin(), names.end(), model) != names.end(), "--model ", model,
           " is not a model this recipe knows. HINT: use one of ", joined(names), ".");
  TY_CHECK(image_size >= 1, "--image-size must be >= 1, got ", image_size, ".");
  TY_CHECK(loader_threads >= 1, "--loader-threads must be >= 1, got ", loader_threads, ".");
  validate_classifier_flags(
      {.epochs = epochs, .batch_size = batch_size, .lr = lr, .bucket_cap_mb = bucket_cap_mb});
  TY_CHECK(limit == -1 || limit >= 1, "--limit must be >= 1 (or omitted for all images), got ",
           limit, ".");
  TY_CHECK(val_limit == -1 || val_limit >= 1,
           "--val-limit must be >= 1 (or omitted for all images), got ", val_limit, ".");
}

Result run_image_folder_rank(const ImageFolderRecipeOptions& options) {
  options.validate();
  Trainer trainer("image-folder", options.run, options.scaling);
  const int rank = trainer.rank();
  const int world = trainer.world_size();
  auto log = logger("train");
  const Splits splits = open_splits(options, rank);
  const data::ImageFolder& train_set = splits.train;
  const data::ImageFolder& val_set = splits.val;
  const std::vector<std::int64_t>& train_positions = splits.train_positions;
  const std::vector<std::int64_t>& val_positions = splits.val_positions;
  const auto num_classes = static_cast<int>(train_set.classes().size());

  torch::manual_seed(options.seed);
  DdpClassifier classifier(models::image_model(options.model, /*in_channels=*/3, num_classes),
                           config_json(options, world, trainer.threads(), train_set, val_set,
                                       static_cast<std::int64_t>(train_positions.size()),
                                       static_cast<std::int64_t>(val_positions.size())),
                           {.lr = options.lr, .bucket_cap_mb = options.bucket_cap_mb}, trainer);
  auto& model = classifier.model();
  const auto device = trainer.device();

  // The sampler deals positions into train_positions; the loader gets the folder's indices.
  data::DistributedSampler sampler(
      {.dataset_size = static_cast<std::int64_t>(train_positions.size()),
       .num_replicas = world,
       .rank = rank,
       .shuffle = true,
       .seed = options.seed});
  // See Note [Full training batches].
  TY_CHECK(sampler.num_samples() >= options.batch_size, "Each of the ", world, " ranks gets ",
           sampler.num_samples(), " of the ", train_positions.size(),
           " training images per epoch, fewer than --batch-size ", options.batch_size,
           ": no full batch to train on. HINT: lower --batch-size, or use more images.");
  auto folder_indices = [&train_positions](std::vector<std::int64_t> positions) {
    for (auto& p : positions) p = train_positions[static_cast<std::size_t>(p)];
    return positions;
  };

  double train_time = 0;
  std::int64_t samples_seen = 0;         // this rank, this attempt
  std::optional<Evaluation> evaluation;  // of the last epoch this attempt trained
  for (int epoch = trainer.progress().epoch; epoch < options.epochs; ++epoch) {
    sampler.set_epoch(epoch);
    const std::int64_t first_position =
        trainer.progress().epoch == epoch ? trainer.progress().epoch_position : std::int64_t{0};
    // The train transform draws from (seed, epoch, index): each epoch augments anew, and a
    // resumed epoch exactly as the interrupted one.
    data::ImageFolderLoader loader(
        train_set, folder_indices(sampler.indices(first_position)),
        {.batch_size = options.batch_size,
         .drop_last = true,  // Note [Full training batches]
         .threads = options.loader_threads,
         .transform = {.kind = data::ImageTransform::kTrain, .size = options.image_size},
         .seed = options.seed,
         .epoch = epoch});
    // The loader's batches are CPU tensors; each goes to the device as it is taken.
    auto next_batch = [&loader, device]() -> std::optional<data::Batch> {
      auto batch = loader.next();
      if (!batch) return std::nullopt;
      return data::Batch{batch->inputs.to(device), batch->targets.to(device)};
    };
    const ClassifierEpoch done = train_classifier_epoch(
        trainer, classifier.ddp_model(), classifier.optimizer(), epoch, loader.num_batches(),
        next_batch,
        {.batch_size = options.batch_size, .lr = options.lr, .progress = options.progress});
    train_time += done.seconds;
    samples_seen += done.samples;

    classifier.sync_buffers();
    evaluation = evaluate(*model, val_set, val_positions, options, trainer);
    const auto skipped = skipped_images(train_set, val_set, trainer);
    trainer.report({{"val_accuracy", evaluation->accuracy},
                    {"val_top5_accuracy", evaluation->top5_accuracy},
                    {"val_loss", evaluation->loss}});
    if (rank == 0)
      log->info(
          "epoch {}: val top-1 {:.4f}, top-5 {:.4f}, loss {:.5f} ({} images); {} samples "
          "skipped, {} corrupt files so far",
          epoch, evaluation->accuracy, evaluation->top5_accuracy, evaluation->loss,
          evaluation->images, skipped.skipped, skipped.corrupt_files);
  }
  const std::string last_checkpoint = trainer.finish_training();

  // A run resumed after its last epoch trains nothing: it evaluates the checkpoint it loaded.
  if (!evaluation) {
    classifier.sync_buffers();
    evaluation = evaluate(*model, val_set, val_positions, options, trainer);
  }
  const auto skipped = skipped_images(train_set, val_set, trainer);
  auto samples = torch::tensor({static_cast<double>(samples_seen)}, torch::kFloat64);
  trainer.all_reduce(samples);
  // The slowest rank's training time decides throughput.
  auto slowest = torch::tensor({train_time}, torch::kFloat64);
  trainer.all_reduce(slowest, /*max=*/true);

  const double train_time_s = slowest.item<double>();
  const double samples_per_s = train_time_s > 0 ? samples.item<double>() / train_time_s : 0;
  Result result{.checkpoint_dir_name = last_checkpoint,  // rank 0's; the others read result.json
                .metrics = {{"restart_count", double(trainer.restart_count()), 0},
                            {"accuracy", evaluation->accuracy, 4},
                            {"top5_accuracy", evaluation->top5_accuracy, 4},
                            {"loss", evaluation->loss, 5},
                            {"global_step", double(trainer.progress().global_step), 0, false},
                            {"train_time_s", train_time_s, 3, false},
                            {"train_samples_per_s", samples_per_s, 1, false},
                            {"val_images", double(evaluation->images), 0, false},
                            {"skipped_images", double(skipped.skipped), 0, false},
                            {"corrupt_files", double(skipped.corrupt_files), 0, false},
                            {"world_size", double(world), 0, false}}};
  if (rank == 0)
    log->info(
        "val top-1 {:.4f}, top-5 {:.4f}, loss {:.5f}; {:.1f} training samples/s; {} samples "
        "skipped ({} corrupt files); results in {}",
        evaluation->accuracy, evaluation->top5_accuracy, evaluation->loss, samples_per_s,
        skipped.skipped, skipped.corrupt_files, options.run.uri());
  trainer.write_result(result);
  return result;
}

}  // namespace trainyard::train
