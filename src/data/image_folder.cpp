#include "trainyard/data/image_folder.h"

#include <sys/stat.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "trainyard/error.h"
#include "trainyard/log.h"

namespace trainyard::data {
namespace fs = std::filesystem;

namespace {

bool has_image_extension(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return std::any_of(std::begin(kImageExtensions), std::end(kImageExtensions),
                     [&](const std::string& ext) { return lower.ends_with(ext); });
}

std::string extension_list() {
  std::string out;
  for (const char* ext : kImageExtensions) {
    if (!out.empty()) out += ' ';
    out += ext;
  }
  return out;
}

// A folder's identity, to tell a folder met again through a symbolic link.
struct FolderId {
  dev_t device;
  ino_t inode;
  bool operator==(const FolderId&) const = default;
};

// Note [Symbolic link loops]
// torchvision walks class folders following symbolic links, so trainyard does too; a link to a
// folder above it (ln -s .. train/cat/loop) would then be walked forever, the listing growing
// until the memory is gone. Each folder's (device, inode) is compared with those of the folders
// on the path from the class folder down to it: meeting one again is a loop, an error naming the
// link and the folder it leads back to. A folder linked twice elsewhere is no loop and is walked
// twice, as torchvision does.
void walk_class_folder(const fs::path& folder,
                       std::vector<std::pair<FolderId, fs::path>>& ancestors,
                       std::vector<std::pair<std::string, std::string>>& found) {
  std::error_code ec;
  fs::directory_iterator it(folder, fs::directory_options::skip_permission_denied, ec);
  TY_CHECK_T(Error, !ec, "Cannot list ", folder.string(), ": ", ec.message(), ".");
  std::vector<fs::path> subfolders;
  for (const fs::directory_iterator end; it != end; it.increment(ec)) {
    TY_CHECK_T(Error, !ec, "Cannot list ", folder.string(), ": ", ec.message(), ".");
    std::error_code type_ec;
    if (it->is_directory(type_ec)) {  // follows a symbolic link, as torchvision does
      subfolders.push_back(it->path());
      continue;
    }
    const std::string name = it->path().filename().string();
    if (has_image_extension(name)) found.emplace_back(folder.string(), name);
  }
  TY_CHECK_T(Error, !ec, "Cannot list ", folder.string(), ": ", ec.message(), ".");
  for (const auto& sub : subfolders) {
    struct stat st {};
    if (::stat(sub.c_str(), &st) != 0) continue;  // gone, or not ours to read
    const FolderId id{st.st_dev, st.st_ino};
    for (const auto& [seen, path] : ancestors) {
      TY_CHECK_T(CorruptDataError, !(seen == id), "The ImageFolder path ", sub.string(),
                 " leads back to ", path.string(),
                 " (a symbolic link loop): walking it would never end. HINT: remove the link, or "
                 "point it at a folder outside the path it sits on.");
    }
    ancestors.emplace_back(id, sub);
    walk_class_folder(sub, ancestors, found);
    ancestors.pop_back();
  }
}

// The images under one class folder, in torchvision's order: sorted(os.walk(folder)) sorts the
// folders by path, then each folder's file names are sorted. Byte order of UTF-8 names is
// Python's code point order. Symbolic links are followed; a loop is an error (Note [Symbolic
// link loops]).
std::vector<std::string> scan_class_folder(const fs::path& root, const std::string& class_name) {
  std::vector<std::pair<std::string, std::string>> found;  // (folder path, file name)
  std::vector<std::pair<FolderId, fs::path>> ancestors;    // the root, then the class folder
  for (const auto& folder : {root, root / class_name}) {
    struct stat st {};
    TY_CHECK_T(Error, ::stat(folder.c_str(), &st) == 0, "Cannot list ", folder.string(), ": ",
               std::strerror(errno), ".");
    ancestors.emplace_back(FolderId{st.st_dev, st.st_ino}, folder);
  }
  walk_class_folder(root / class_name, ancestors, found);
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  paths.reserve(found.size());
  for (const auto& [dir, name] : found) paths.push_back(dir + "/" + name);
  return paths;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

}  // namespace

// --- ImageFolder ------------------------------------------------------------------------------

struct ImageFolder::State {
  State(std::size_t size, std::size_t classes)
      : corrupt(new std::atomic<bool>[size]()),
        class_corrupt(new std::atomic<std::int64_t>[classes]()),
        class_size(classes, 0) {}

  std::atomic<std::int64_t> decoded{0};
  std::atomic<std::int64_t> skipped{0};
  std::atomic<std::int64_t> corrupt_files{0};
  std::unique_ptr<std::atomic<bool>[]> corrupt;  // per sample: its file could not be decoded
  std::unique_ptr<std::atomic<std::int64_t>[]> class_corrupt;  // per class: its corrupt files
  std::vector<std::int64_t> class_size;                        // per class: its files
};

ImageFolder::ImageFolder(std::string root, ImageFolderOptions options)
    : root_(std::move(root)), options_(options) {
  const std::string layout_hint =
      " HINT: ImageFolder expects torchvision's layout, root/<class>/<image>: one folder per "
      "class holding its images (" +
      extension_list() + ").";
  std::error_code ec;
  TY_CHECK(fs::exists(root_, ec), "The ImageFolder root ", root_, " does not exist.", layout_hint);
  TY_CHECK(fs::is_directory(root_, ec), "The ImageFolder root ", root_, " is not a folder.",
           layout_hint);
  fs::directory_iterator it(root_, ec);
  TY_CHECK_T(Error, !ec, "Cannot list ", root_, ": ", ec.message(), ".");
  for (const fs::directory_iterator end; it != end; it.increment(ec)) {
    TY_CHECK_T(Error, !ec, "Cannot list ", root_, ": ", ec.message(), ".");
    std::error_code type_ec;
    if (it->is_directory(type_ec)) classes_.push_back(it->path().filename().string());
  }
  std::sort(classes_.begin(), classes_.end());
  TY_CHECK(!classes_.empty(), "The ImageFolder root ", root_, " has no class folders.",
           layout_hint);

  std::vector<std::string> empty_classes;
  for (std::size_t c = 0; c < classes_.size(); ++c) {
    auto paths = scan_class_folder(fs::path(root_), classes_[c]);
    if (paths.empty()) empty_classes.push_back(classes_[c]);
    for (auto& path : paths)
      samples_.push_back({.path = std::move(path), .label = static_cast<std::int64_t>(c)});
  }
  TY_CHECK(!samples_.empty(), "The ImageFolder root ", root_, " holds no images: none of its ",
           classes_.size(), " class folders (", join(classes_), ") has a file ending in ",
           extension_list(), ".", layout_hint);
  TY_CHECK(empty_classes.empty(), "The ImageFolder root ", root_, " has ", empty_classes.size(),
           " class folder(s) without images: ", join(empty_classes),
           ". HINT: remove them or add images (", extension_list(),
           "); an empty class would still take a label index.");
  state_ = std::make_unique<State>(samples_.size(), classes_.size());
  for (const auto& sample : samples_) ++state_->class_size[sample.label];
}

ImageFolder::~ImageFolder() = default;
ImageFolder::ImageFolder(ImageFolder&&) noexcept = default;
ImageFolder& ImageFolder::operator=(ImageFolder&&) noexcept = default;

ImageFolder::Loaded ImageFolder::load(std::int64_t index) const {
  const std::int64_t n = size();
  TY_CHECK(index >= 0 && index < n, "ImageFolder::load: index ", index, " is outside [0, ", n,
           ").");
  for (std::int64_t k = 0; k < n; ++k) {
    const std::int64_t i = (index + k) % n;
    if (state_->corrupt[i].load(std::memory_order_relaxed)) continue;
    try {
      RgbImage image = decode_image_file(samples_[i].path);
      state_->decoded.fetch_add(1, std::memory_order_relaxed);
      if (k > 0) state_->skipped.fetch_add(1, std::memory_order_relaxed);
      return {.image = std::move(image), .label = samples_[i].label, .index = i};
    } catch (const Error& e) {  // unreadable (Error) or undecodable (CorruptDataError)
      if (options_.strict) throw;
      if (!state_->corrupt[i].exchange(true)) {
        state_->corrupt_files.fetch_add(1, std::memory_order_relaxed);
        std::string reason = e.what();
        if (!reason.ends_with('.')) reason += '.';
        logger("data")->warn("{} Skipped: its samples are replaced by the next image that decodes.",
                             reason);
        const auto label = samples_[i].label;
        const auto corrupt = state_->class_corrupt[label].fetch_add(1) + 1;
        // A class whose every file is corrupt would train on other classes' images under its
        // label, or on none: an error naming it, not one warning per file.
        TY_CHECK_T(CorruptDataError, corrupt < state_->class_size[label], "Class '",
                   classes_[label], "' of the ImageFolder ", root_,
                   " has no image that decodes: ", "all ", state_->class_size[label],
                   " of its files under ", (fs::path(root_) / classes_[label]).string(),
                   " failed (the warnings above name them). HINT: replace its files with images "
                   "that decode, or remove the class folder.");
      }
    }
  }
  throw CorruptDataError(detail::concat("None of the ", n, " images under ", root_,
                                        " could be decoded (the warnings above name them)."));
}

ImageFolderStats ImageFolder::stats() const {
  return {.decoded = state_->decoded.load(),
          .skipped = state_->skipped.load(),
          .corrupt_files = state_->corrupt_files.load()};
}

// --- ImageFolderLoader ------------------------------------------------------------------------
// Note [Loader order]
// Samples are claimed one at a time in the order of `indices`, by whichever thread is free, but
// only from the prefetch_batches batches after the last one consumed. The first claim of a batch
// allocates its tensors; each thread writes its sample into its row, so rows keep their places
// whatever order the samples finish in, and the consumer takes a batch once all its rows are
// written. A sample's content depends only on (seed, epoch, index) and the files, so the batches
// are the same for any number of threads.

void ImageLoaderOptions::validate() const {
  TY_CHECK(batch_size >= 1, "ImageLoaderOptions.batch_size must be >= 1, got ", batch_size, ".");
  TY_CHECK(threads >= 1, "ImageLoaderOptions.threads (--loader-threads) must be >= 1, got ",
           threads, ".");
  TY_CHECK(prefetch_batches >= 1, "ImageLoaderOptions.prefetch_batches must be >= 1, got ",
           prefetch_batches, ".");
  transform.validate();
}

ImageFolderLoader::ImageFolderLoader(const ImageFolder& dataset,
                                     std::vector<std::int64_t> indices,
                                     ImageLoaderOptions options)
    : dataset_(dataset), indices_(std::move(indices)), options_(std::move(options)) {
  options_.validate();
  for (const auto index : indices_)
    TY_CHECK(index >= 0 && index < dataset_.size(), "ImageFolderLoader: index ", index,
             " is outside the data set's [0, ", dataset_.size(), ").");
  const auto n = static_cast<std::int64_t>(indices_.size());
  const auto b = options_.batch_size;
  num_batches_ = options_.drop_last ? n / b : (n + b - 1) / b;
  num_positions_ = std::min(n, num_batches_ * b);
  try {
    for (int t = 0; t < options_.threads; ++t) threads_.emplace_back([this] { work(); });
  } catch (...) {
    stop_threads();
    throw;
  }
}

ImageFolderLoader::~ImageFolderLoader() {
  stop_threads();
}

void ImageFolderLoader::stop_threads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  for (auto& thread : threads_)
    if (thread.joinable()) thread.join();
}

std::int64_t ImageFolderLoader::batch_rows(std::int64_t batch) const {
  return std::min(options_.batch_size, num_positions_ - batch * options_.batch_size);
}

void ImageFolderLoader::work() {
  const std::int64_t b = options_.batch_size;
  const std::int64_t size = options_.transform.size;
  const std::int64_t image_floats = 3 * size * size;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] {
      return stop_ || error_ != nullptr || next_position_ >= num_positions_ ||
             next_position_ / b < consumed_ + options_.prefetch_batches;
    });
    if (stop_ || error_ != nullptr || next_position_ >= num_positions_) return;
    const std::int64_t position = next_position_++;
    const std::int64_t batch = position / b;
    const std::int64_t row = position % b;
    if (batch - consumed_ == static_cast<std::int64_t>(pending_.size())) {
      const std::int64_t rows = batch_rows(batch);
      pending_.push_back({.batch = {.inputs = torch::empty({rows, 3, size, size}, torch::kFloat32),
                                    .targets = torch::empty({rows}, torch::kInt64)},
                          .remaining = rows});
    }
    // The tensors stay alive in pending_ until this row is written and the batch consumed.
    Batch& slot = pending_[static_cast<std::size_t>(batch - consumed_)].batch;
    float* image_out = slot.inputs.data_ptr<float>() + row * image_floats;
    std::int64_t* label_out = slot.targets.data_ptr<std::int64_t>() + row;
    const std::int64_t index = indices_[static_cast<std::size_t>(position)];
    lock.unlock();

    try {
      ImageFolder::Loaded loaded = dataset_.load(index);
      SampleRandom random(options_.seed, options_.epoch, index);
      const RgbImage image = transform_image(loaded.image, options_.transform, random);
      to_normalized_chw(image, options_.transform.mean, options_.transform.stddev, image_out);
      *label_out = loaded.label;
    } catch (...) {
      lock.lock();
      if (error_ == nullptr) error_ = std::current_exception();
      changed_.notify_all();
      return;
    }

    lock.lock();
    if (--pending_[static_cast<std::size_t>(batch - consumed_)].remaining == 0)
      changed_.notify_all();
  }
}

std::optional<Batch> ImageFolderLoader::next() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (consumed_ >= num_batches_) return std::nullopt;
  auto front_ready = [&] { return !pending_.empty() && pending_.front().remaining == 0; };
  changed_.wait(lock, [&] { return front_ready() || error_ != nullptr; });
  if (!front_ready()) std::rethrow_exception(error_);
  Batch batch = std::move(pending_.front().batch);
  pending_.pop_front();
  ++consumed_;
  lock.unlock();
  changed_.notify_all();
  return batch;
}

}  // namespace trainyard::data
