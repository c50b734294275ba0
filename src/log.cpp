#include "trainyard/log.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include "trainyard/env.h"

namespace trainyard {
namespace {

struct Registry {
  std::mutex mutex;
  std::unordered_map<std::string, std::shared_ptr<spdlog::logger>> loggers;
  std::string rank_text = "rank -";
};

Registry& registry() {
  static Registry r;
  return r;
}

spdlog::level::level_enum level_from_env() {
  const char* v = std::getenv(kLogLevelEnv);
  if (v == nullptr || *v == '\0') return spdlog::level::info;
  auto level = spdlog::level::from_str(v);
  // from_str answers "off" for anything it does not know; only "off" itself means off.
  if (level == spdlog::level::off && std::string(v) != "off") return spdlog::level::info;
  return level;
}

// Must hold registry().mutex.
void apply_pattern(spdlog::logger& l, const std::string& component, const std::string& rank) {
  l.set_pattern("[%L %H:%M:%S.%e " + rank + " " + component + "] %v");
}

}  // namespace

std::shared_ptr<spdlog::logger> logger(const std::string& component) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.loggers.find(component);
  if (it != r.loggers.end()) return it->second;
  // A sink per logger: a pattern belongs to the sink, and each component has its own tag.
  // stderr sinks share spdlog's console mutex, so lines never interleave.
  auto l = std::make_shared<spdlog::logger>(component,
                                            std::make_shared<spdlog::sinks::stderr_sink_mt>());
  l->set_level(level_from_env());
  apply_pattern(*l, component, r.rank_text);
  r.loggers.emplace(component, l);
  return l;
}

void set_log_rank(int rank, int world_size) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.rank_text = "rank " + std::to_string(rank) + "/" + std::to_string(world_size);
  for (auto& [name, l] : r.loggers) apply_pattern(*l, name, r.rank_text);
}

}  // namespace trainyard
