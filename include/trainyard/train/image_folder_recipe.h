// Image classification on a folder laid out as the seed arranges ImageNet: DIR/train/<class>/...
// and DIR/val/<class>/... (data/image_folder.h), any torchvision model image_model() knows
// (ResNet18..101, EfficientNet B0..B7), torchvision's ImageNet transforms, Adam, and
// DistributedDataParallel across the ranks of the job. Each epoch ends with an evaluation on
// val/: top-1 and top-5 accuracy and the loss, the same on every rank.
//
// Fault tolerance is the Trainer's (train/trainer.h), as in the fashion-mnist recipe: rank 0
// saves a checkpoint every checkpoint_every steps and at the end, and every start resumes from
// the newest complete one. A sample's augmentation depends only on (seed, epoch, index), so with
// the same world size a resumed run computes what an uninterrupted one does.
#pragma once

#include <cstdint>
#include <string>

#include "trainyard/data/image_folder.h"
#include "trainyard/train/result.h"
#include "trainyard/train/run_config.h"

namespace trainyard::train {

struct ImageFolderRecipeOptions {
  static constexpr const char* kDefaultModel = "resnet50";

  RunConfig run{.name = "image-folder"};
  ScalingConfig scaling;
  std::string data;                   // holds train/ and val/, each in ImageFolder layout
  std::string model = kDefaultModel;  // a name from models::image_model_names()
  int image_size = data::ImageTransformOptions::kDefaultSize;      // side of the crops, pixels
  int loader_threads = data::ImageLoaderOptions::kDefaultThreads;  // decoding threads per rank
  bool strict = false;  // an image that cannot be decoded stops the run instead of being skipped
  int epochs = 10;
  std::int64_t batch_size = 32;  // per rank; an epoch's last, smaller batch is dropped
  double lr = 1e-3;              // Adam
  // Train on `limit` training images spread evenly over train/ (every class keeps its share);
  // -1: all. val_limit likewise for the evaluation.
  std::int64_t limit = -1;
  std::int64_t val_limit = -1;
  std::uint64_t seed = 0;     // initialisation, shuffling and augmentation
  double bucket_cap_mb = 25;  // DdpOptions::bucket_size_bytes in MiB
  bool progress = true;       // a progress bar on rank 0 when the output is a terminal

  // Throws InvalidArgumentError naming the first bad flag (the configs' too): also when --data,
  // its train/ or its val/ is missing (naming the path), or --model is unknown (listing the
  // known ones). Cheap: it does not scan the folders.
  void validate() const;
};

// Runs one rank of the job on the Trainer; the environment contract (RANK, WORLD_SIZE, ...) must
// be present. Rank 0 writes <storage>/<name>/checkpoint_NNNNNN/{model.pt,...}, result.json and
// config.json. The result holds the last evaluation's accuracy, top5_accuracy and loss, the
// training throughput, and the images skipped because their file could not be decoded.
// Throws InvalidArgumentError when val/ does not have train/'s classes.
Result run_image_folder_rank(const ImageFolderRecipeOptions& options);

}  // namespace trainyard::train
