#include "trainyard/data/batch_loader.h"

#include "trainyard/error.h"

namespace trainyard::data {

BatchLoader::BatchLoader(std::vector<std::int64_t> indices,
                         MakeBatch make_batch,
                         LoaderOptions options)
    : indices_(std::move(indices)), make_batch_(std::move(make_batch)), options_(options) {
  TY_CHECK(options_.batch_size >= 1, "LoaderOptions.batch_size must be >= 1, got ",
           options_.batch_size, ".");
  TY_CHECK(options_.prefetch >= 1, "LoaderOptions.prefetch must be >= 1, got ", options_.prefetch,
           ".");
  const auto n = static_cast<std::int64_t>(indices_.size());
  num_batches_ = options_.drop_last ? n / options_.batch_size
                                    : (n + options_.batch_size - 1) / options_.batch_size;
  worker_ = std::thread([this] { produce(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void BatchLoader::produce() {
  for (std::int64_t b = 0; b < num_batches_; ++b) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock,
                    [&] { return stop_ || static_cast<int>(ready_.size()) < options_.prefetch; });
      if (stop_) return;
    }
    const auto begin = b * options_.batch_size;
    const auto end = std::min<std::int64_t>(begin + options_.batch_size, indices_.size());
    std::vector<std::int64_t> slice(indices_.begin() + begin, indices_.begin() + end);
    try {
      Batch batch = make_batch_(slice);
      std::lock_guard<std::mutex> lock(mutex_);
      ready_.push_back(std::move(batch));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::current_exception();
      changed_.notify_all();
      return;
    }
    changed_.notify_all();
  }
}

std::optional<Batch> BatchLoader::next() {
  if (consumed_ >= num_batches_) return std::nullopt;
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return !ready_.empty() || error_ != nullptr; });
  if (ready_.empty()) std::rethrow_exception(error_);
  Batch batch = std::move(ready_.front());
  ready_.pop_front();
  ++consumed_;
  lock.unlock();
  changed_.notify_all();
  return batch;
}

}  // namespace trainyard::data
