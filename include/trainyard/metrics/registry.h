// Counters and gauges a process updates as it works, read out as a Snapshot. A rank's library
// code (collectives, checkpoints, the Trainer) records into process_registry(); the agent reads
// each rank's snapshot from the file its publisher writes (metrics/rank_files.h).
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "trainyard/metrics/snapshot.h"

namespace trainyard::metrics {

// A value that only goes up. add() is lock-free and thread-safe.
class Counter {
 public:
  void add(double amount = 1) {
    double v = value_.load(std::memory_order_relaxed);
    while (!value_.compare_exchange_weak(v, v + amount, std::memory_order_relaxed)) {
    }
  }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// A value that goes up and down. Lock-free and thread-safe.
class Gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void add(double amount) {
    double v = value_.load(std::memory_order_relaxed);
    while (!value_.compare_exchange_weak(v, v + amount, std::memory_order_relaxed)) {
    }
  }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Families of counters and gauges by name and label set. counter()/gauge() look a series up
// (creating it at 0) under a mutex: callers on hot paths keep the returned reference, which stays
// valid for the registry's life. Thread-safe.
class Registry {
 public:
  // Throws InvalidArgumentError for a bad metric or label name, or when `name` is already a
  // family of the other type.
  Counter& counter(std::string_view name, std::string_view help, const Labels& labels = {});
  Gauge& gauge(std::string_view name, std::string_view help, const Labels& labels = {});

  // Every series' current value, families in registration order.
  Snapshot snapshot() const;

 private:
  struct Series {
    Labels labels;
    Counter counter;
    Gauge gauge;
  };
  struct FamilyEntry {
    std::string name;
    MetricType type;
    std::string help;
    std::map<Labels, Series*> by_labels;
  };
  Series& find_or_add(std::string_view name,
                      MetricType type,
                      std::string_view help,
                      const Labels& labels);

  mutable std::mutex mutex_;
  std::deque<FamilyEntry> families_;  // guarded by mutex_; deque: stable addresses
  std::deque<Series> series_;         // guarded by mutex_
};

// This process's registry, which library code records into. See Note [One registry per process]
// in src/metrics/registry.cpp.
Registry& process_registry();

}  // namespace trainyard::metrics
