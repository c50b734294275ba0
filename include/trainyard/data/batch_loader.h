// BatchLoader: cuts a list of sample indices into batches and builds each batch on a background
// thread, `prefetch` batches ahead of the training loop.
#pragma once

#include <torch/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace trainyard::data {

struct Batch {
  torch::Tensor inputs;
  torch::Tensor targets;
};

struct LoaderOptions {
  std::int64_t batch_size = 1;
  bool drop_last = false;  // drop a final batch smaller than batch_size
  int prefetch = 2;        // batches built ahead of the consumer
};

class BatchLoader {
 public:
  using MakeBatch = std::function<Batch(const std::vector<std::int64_t>& indices)>;

  // Starts the background thread at once. `make_batch` runs on it.
  BatchLoader(std::vector<std::int64_t> indices, MakeBatch make_batch, LoaderOptions options);
  ~BatchLoader();  // stops and joins the background thread
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // The next batch, blocking until it is built; nullopt after the last. Rethrows an exception
  // thrown by make_batch.
  std::optional<Batch> next();
  std::int64_t num_batches() const { return num_batches_; }

 private:
  void produce();

  std::vector<std::int64_t> indices_;
  MakeBatch make_batch_;
  LoaderOptions options_;
  std::int64_t num_batches_ = 0;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Batch> ready_;    // guarded by mutex_
  std::int64_t consumed_ = 0;  // consumer thread only
  bool stop_ = false;          // guarded by mutex_
  std::exception_ptr error_;   // guarded by mutex_
  std::thread worker_;
};

}  // namespace trainyard::data
