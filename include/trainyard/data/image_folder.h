// ImageFolder with torchvision's layout and order: root/<class>/**/<image>, classes indexed in
// sorted name order, samples sorted by folder then file name; JPEG and PNG decoded to RGB, a file
// that cannot be decoded skipped (or, with strict, an error). ImageFolderLoader decodes and
// transforms batches on a pool of threads, ahead of the training loop, in a fixed order.
#pragma once

#include <torch/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "trainyard/data/batch_loader.h"
#include "trainyard/data/image_decode.h"
#include "trainyard/data/image_transforms.h"

namespace trainyard::data {

// The file name endings (compared lower-cased) that the scan keeps; torchvision's
// IMG_EXTENSIONS has more, but JPEG and PNG are what ImageFolder decodes.
inline constexpr const char* kImageExtensions[] = {".jpg", ".jpeg", ".png"};

struct ImageSample {
  std::string path;
  std::int64_t label = 0;  // index into ImageFolder::classes()
};

struct ImageFolderOptions {
  bool strict = false;  // a file that cannot be decoded throws instead of being skipped
};

// Counts since the ImageFolder was made; read at any time from any thread.
struct ImageFolderStats {
  std::int64_t decoded = 0;        // images decoded
  std::int64_t skipped = 0;        // samples replaced because their file could not be decoded
  std::int64_t corrupt_files = 0;  // distinct files that could not be decoded
};

class ImageFolder {
 public:
  // Scans `root` (following symbolic links). Throws InvalidArgumentError when the root is missing
  // or not a folder, has no class folder, has no image at all, or has class folders without
  // images (all of them named); CorruptDataError naming the link when a symbolic link leads back
  // to a folder above it (Note [Symbolic link loops] in image_folder.cpp).
  explicit ImageFolder(std::string root, ImageFolderOptions options = {});
  ~ImageFolder();
  ImageFolder(ImageFolder&&) noexcept;
  ImageFolder& operator=(ImageFolder&&) noexcept;

  const std::string& root() const { return root_; }
  const std::vector<std::string>& classes() const { return classes_; }
  const std::vector<ImageSample>& samples() const { return samples_; }
  std::int64_t size() const { return static_cast<std::int64_t>(samples_.size()); }

  struct Loaded {
    RgbImage image;
    std::int64_t label = 0;
    std::int64_t index = 0;  // the sample decoded: the one asked for, or its replacement
  };

  // Decodes sample `index`. A file that cannot be decoded throws CorruptDataError naming it and
  // the decoder's message when strict; otherwise it is logged (once per file), counted in
  // stats().skipped, remembered (not read again) and replaced by the next decodable sample
  // (index + 1, index + 2, ..., wrapping around), so that a batch keeps its size and every rank
  // its step count. Throws CorruptDataError naming the class once every file of a class has
  // failed to decode (its label would have no image), and when no file at all can be decoded.
  // Thread-safe.
  Loaded load(std::int64_t index) const;

  ImageFolderStats stats() const;

 private:
  struct State;  // atomics: counters and the corrupt-file marks

  std::string root_;
  ImageFolderOptions options_;
  std::vector<std::string> classes_;
  std::vector<ImageSample> samples_;
  std::unique_ptr<State> state_;
};

struct ImageLoaderOptions {
  static constexpr int kDefaultThreads = 4;
  static constexpr int kDefaultPrefetchBatches = 2;

  std::int64_t batch_size = 1;
  bool drop_last = false;                          // drop a final batch smaller than batch_size
  int threads = kDefaultThreads;                   // decoding threads (--loader-threads)
  int prefetch_batches = kDefaultPrefetchBatches;  // batches in flight ahead of the consumer
  ImageTransformOptions transform;
  std::uint64_t seed = 0;  // with epoch and the sample's index, seeds the sample's transform
  std::int64_t epoch = 0;

  // Throws InvalidArgumentError naming the field and value.
  void validate() const;
};

// Batches of `indices` (from a DistributedSampler, say) in that order: inputs (B, 3, size, size)
// float, normalised; targets (B,) int64. `threads` threads decode and transform the samples of
// the next `prefetch_batches` batches, each writing its sample straight into the batch's tensor.
// What a batch holds depends only on the indices, the options and the files, never on the
// number of threads or their timing (each sample draws from SampleRandom(seed, epoch, index)).
// See Note [Loader order].
class ImageFolderLoader {
 public:
  // Starts the threads at once. `dataset` must outlive the loader.
  ImageFolderLoader(const ImageFolder& dataset,
                    std::vector<std::int64_t> indices,
                    ImageLoaderOptions options);
  // Stops the threads after the sample each is working on, and joins them; the consumer may
  // stop early.
  ~ImageFolderLoader();
  ImageFolderLoader(const ImageFolderLoader&) = delete;
  ImageFolderLoader& operator=(const ImageFolderLoader&) = delete;

  // The next batch, blocking until it is ready; nullopt after the last. Rethrows the first
  // exception a thread met (with strict, a file that cannot be decoded). Call from one thread.
  std::optional<Batch> next();
  std::int64_t num_batches() const { return num_batches_; }

 private:
  struct Pending {
    Batch batch;
    std::int64_t remaining = 0;  // samples not yet written
  };

  void work();
  void stop_threads();  // sets stop_ and joins; never throws
  std::int64_t batch_rows(std::int64_t batch) const;

  const ImageFolder& dataset_;  // outlives the loader (caller's promise)
  std::vector<std::int64_t> indices_;
  ImageLoaderOptions options_;
  std::int64_t num_batches_ = 0;
  std::int64_t num_positions_ = 0;  // samples in the num_batches_ batches

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Pending> pending_;     // batches consumed_, consumed_ + 1, ...; guarded by mutex_
  std::int64_t consumed_ = 0;       // guarded by mutex_
  std::int64_t next_position_ = 0;  // the next sample to claim; guarded by mutex_
  bool stop_ = false;               // guarded by mutex_
  std::exception_ptr error_;        // guarded by mutex_
  std::vector<std::thread> threads_;
};

}  // namespace trainyard::data
