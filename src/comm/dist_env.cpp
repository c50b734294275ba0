#include "trainyard/comm/dist_env.h"

#include <cerrno>
#include <cstdlib>
#include <limits>

#include "trainyard/error.h"

namespace trainyard {
namespace {

constexpr const char* kHint =
    " HINT: start this program with `trainyard run --nproc-per-node N -- PROGRAM ...` (or "
    "torchrun), which sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT.";

long parse_int(const std::string& name, const std::string& text, long lo, long hi) {
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  TY_CHECK(!text.empty() && end != nullptr && *end == '\0' && errno == 0, "Environment variable ",
           name, "='", text, "' is not an integer.", kHint);
  TY_CHECK(v >= lo && v <= hi, "Environment variable ", name, "=", v, " is out of range [", lo,
           ", ", hi, "].", kHint);
  return v;
}

std::string require(const EnvLookup& env, const std::string& name) {
  auto v = env(name);
  TY_CHECK(v.has_value() && !v->empty(), "Environment variable ", name, " is not set.", kHint);
  return *v;
}

long optional_int(const EnvLookup& env, const std::string& name, long fallback, long lo, long hi) {
  auto v = env(name);
  if (!v.has_value() || v->empty()) return fallback;
  return parse_int(name, *v, lo, hi);
}

}  // namespace

bool dist_env_present(const EnvLookup& env) {
  return env(kRankEnv).has_value() && env(kWorldSizeEnv).has_value();
}

DistEnv parse_dist_env(const EnvLookup& env) {
  constexpr long kMaxInt = std::numeric_limits<int>::max();
  DistEnv e;
  e.world_size =
      static_cast<int>(parse_int(kWorldSizeEnv, require(env, kWorldSizeEnv), 1, kMaxInt));
  e.rank = static_cast<int>(parse_int(kRankEnv, require(env, kRankEnv), 0, e.world_size - 1));
  e.local_world_size =
      static_cast<int>(optional_int(env, kLocalWorldSizeEnv, e.world_size, 1, e.world_size));
  e.local_rank = static_cast<int>(
      optional_int(env, kLocalRankEnv, e.rank % e.local_world_size, 0, e.local_world_size - 1));
  e.group_rank = static_cast<int>(optional_int(env, kGroupRankEnv, 0, 0, kMaxInt));
  e.master_addr = require(env, kMasterAddrEnv);
  e.master_port =
      static_cast<std::uint16_t>(parse_int(kMasterPortEnv, require(env, kMasterPortEnv), 1, 65535));
  e.restart_count = static_cast<int>(optional_int(env, kRestartCountEnv, 0, 0, kMaxInt));
  e.run_id = env(kRunIdEnv).value_or("");
  auto agent_store = env(kUseAgentStoreEnv).value_or("");
  e.use_agent_store = agent_store == "True" || agent_store == "true" || agent_store == "1";
  return e;
}

}  // namespace trainyard
