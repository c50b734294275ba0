#include "trainyard/elastic/launch_contract.h"

#include <charconv>
#include <cstdint>

#include "trainyard/error.h"

namespace trainyard::elastic {
namespace {

// How an engine names node 0's host: directly, or as the first of a list of every node's.
enum class HostList {
  kNone,
  kSlurm,  // Slurm's compressed list (expand_slurm_hostlist)
  kLines,  // one host per line (SkyPilot, dstack)
};

// One engine's launch contract: which of its variables gives each setting (nullptr: none).
struct EngineRow {
  const char* name;
  // Present: this engine started the process. nullptr: any of the row's variables.
  const char* marker;
  const char* companion;  // must be present too (nullptr: nothing else)
  const char* nnodes;
  const char* node_rank;
  const char* nproc_per_node;
  bool zero_nproc_is_none;  // a count of 0 GPUs (CPU nodes) says nothing about ranks per node
  const char* master_addr;
  const char* hosts;  // every node's host, node 0's first
  HostList host_list;
  const char* master_port;
  const char* run_id;
  const char* rdzv_backend;
  const char* rdzv_endpoint;
  // The row's name when it runs in a Kubernetes pod (torchrun's variables set by Kubeflow's
  // operators: Trainer v2's torch-distributed runtime, or a v1 PyTorchJob).
  const char* name_in_pod;
};

// Note [Launch contracts]
// Each engine that starts one `trainyard run` per node tells it the node count, its node's rank
// and node 0's address in variables of its own; trainyard run's flags, when given, win. Kubeflow
// Trainer v2 sets torchrun's PET_NNODES, PET_NPROC_PER_NODE (auto on GPU pods), PET_NODE_RANK,
// PET_MASTER_ADDR and PET_MASTER_PORT and no WORLD_SIZE or RANK; Slurm's SLURM_JOB_NODELIST is
// compressed (node[01-03,7]) and its first host is node 0; SkyPilot and dstack list every node's
// IP, one per line, node 0's first, and give GPUs per node (0 on CPU nodes: no say then); Volcano's
// pytorch plugin counts WORLD_SIZE and RANK in pods, one per node, beside VC_TASK_INDEX. The
// schedulers come first, so a job under Slurm with PET_* set too is Slurm's; the variables they
// share must agree.
constexpr EngineRow kEngines[] = {
    {.name = "slurm",
     .marker = kSlurmJobIdEnv,
     .companion = kSlurmJobNodelistEnv,
     .nnodes = kSlurmNnodesEnv,
     .node_rank = kSlurmNodeIdEnv,
     .nproc_per_node = nullptr,
     .zero_nproc_is_none = false,
     .master_addr = nullptr,
     .hosts = kSlurmJobNodelistEnv,
     .host_list = HostList::kSlurm,
     .master_port = nullptr,
     .run_id = kSlurmJobIdEnv,
     .rdzv_backend = nullptr,
     .rdzv_endpoint = nullptr,
     .name_in_pod = nullptr},
    {.name = "skypilot",
     .marker = kSkypilotNodeRankEnv,
     .companion = kSkypilotNodeIpsEnv,
     .nnodes = kSkypilotNumNodesEnv,
     .node_rank = kSkypilotNodeRankEnv,
     .nproc_per_node = kSkypilotNumGpusPerNodeEnv,
     .zero_nproc_is_none = true,
     .master_addr = nullptr,
     .hosts = kSkypilotNodeIpsEnv,
     .host_list = HostList::kLines,
     .master_port = nullptr,
     .run_id = kSkypilotTaskIdEnv,
     .rdzv_backend = nullptr,
     .rdzv_endpoint = nullptr,
     .name_in_pod = nullptr},
    {.name = "dstack",
     .marker = kDstackNodeRankEnv,
     .companion = kDstackMasterNodeIpEnv,
     .nnodes = kDstackNodesNumEnv,
     .node_rank = kDstackNodeRankEnv,
     .nproc_per_node = kDstackGpusPerNodeEnv,
     .zero_nproc_is_none = true,
     .master_addr = kDstackMasterNodeIpEnv,
     .hosts = kDstackNodesIpsEnv,
     .host_list = HostList::kLines,
     .master_port = nullptr,
     .run_id = kDstackRunNameEnv,
     .rdzv_backend = nullptr,
     .rdzv_endpoint = nullptr,
     .name_in_pod = nullptr},
    {.name = "volcano",
     .marker = kVolcanoTaskIndexEnv,
     .companion = kMasterAddrEnv,
     .nnodes = kWorldSizeEnv,
     .node_rank = kRankEnv,
     .nproc_per_node = nullptr,
     .zero_nproc_is_none = false,
     .master_addr = kMasterAddrEnv,
     .hosts = nullptr,
     .host_list = HostList::kNone,
     .master_port = kMasterPortEnv,
     .run_id = nullptr,
     .rdzv_backend = nullptr,
     .rdzv_endpoint = nullptr,
     .name_in_pod = nullptr},
    {.name = "torchrun",
     .marker = nullptr,
     .companion = nullptr,
     .nnodes = kPetNnodesEnv,
     .node_rank = kPetNodeRankEnv,
     .nproc_per_node = kPetNprocPerNodeEnv,
     .zero_nproc_is_none = false,
     .master_addr = kPetMasterAddrEnv,
     .hosts = nullptr,
     .host_list = HostList::kNone,
     .master_port = kPetMasterPortEnv,
     .run_id = kPetRdzvIdEnv,
     .rdzv_backend = kPetRdzvBackendEnv,
     .rdzv_endpoint = kPetRdzvEndpointEnv,
     .name_in_pod = "kubeflow"},
};

std::optional<std::string> env_value(const EnvLookup& env, const char* name) {
  if (name == nullptr) return std::nullopt;
  auto v = env(name);
  if (!v || v->empty()) return std::nullopt;
  return v;
}

std::optional<long long> parse_count(std::string_view text) {
  long long value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

int count_of(const std::string& text, const char* var, long long min, long long max) {
  const auto n = parse_count(text);
  TY_CHECK(n && *n >= min && *n <= max, var, "='", text, "' must be a whole number from ", min,
           " to ", max, ".");
  return static_cast<int>(*n);
}

std::vector<std::string> host_lines(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    auto end = text.find_first_of("\n", start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    while (!line.empty() && line.front() == ' ') line.erase(0, 1);
    if (!line.empty()) out.push_back(line);
    start = end + 1;
  }
  return out;
}

bool engine_present(const EnvLookup& env, const EngineRow& row) {
  if (row.marker != nullptr) return env_value(env, row.marker).has_value();
  for (const char* var : {row.nnodes, row.node_rank, row.nproc_per_node, row.master_addr,
                          row.master_port, row.run_id, row.rdzv_backend, row.rdzv_endpoint})
    if (env_value(env, var)) return true;
  return false;
}

// The contract of one engine's row.
LaunchContract read_engine(const EnvLookup& env, const EngineRow& row) {
  LaunchContract c;
  c.engine =
      row.name_in_pod && env_value(env, kKubernetesServiceHostEnv) ? row.name_in_pod : row.name;
  c.engine_source = row.marker ? row.marker : "PET_* variables";
  if (row.companion != nullptr)
    TY_CHECK(env_value(env, row.companion).has_value(), row.marker, " is set, so ", row.name,
             " started this process, but ", row.companion,
             " is not: trainyard run cannot tell node 0's address. HINT: run under the ", row.name,
             " job's own environment, or give --master-addr and --node-rank.");
  if (auto v = env_value(env, row.nnodes)) {
    // torchrun's --nnodes may be MIN:MAX (elastic); the engines' are counts.
    if (row.nnodes == kPetNnodesEnv)
      c.nnodes = Sourced<std::string>{*v, row.nnodes};
    else
      c.nnodes =
          Sourced<std::string>{std::to_string(count_of(*v, row.nnodes, 1, 1 << 20)), row.nnodes};
  }
  if (auto v = env_value(env, row.node_rank))
    c.node_rank = Sourced<int>{count_of(*v, row.node_rank, 0, 1 << 20), row.node_rank};
  if (auto v = env_value(env, row.nproc_per_node)) {
    if (!(row.zero_nproc_is_none && *v == "0"))
      c.nproc_per_node = Sourced<std::string>{*v, row.nproc_per_node};
  }
  if (auto v = env_value(env, row.master_port))
    c.master_port = Sourced<int>{count_of(*v, row.master_port, 0, 65535), row.master_port};
  if (auto v = env_value(env, row.run_id)) c.run_id = Sourced<std::string>{*v, row.run_id};
  if (auto v = env_value(env, row.rdzv_backend))
    c.rdzv_backend = Sourced<std::string>{*v, row.rdzv_backend};
  if (auto v = env_value(env, row.rdzv_endpoint))
    c.rdzv_endpoint = Sourced<std::string>{*v, row.rdzv_endpoint};

  std::vector<std::string> hosts;
  if (auto v = env_value(env, row.hosts)) {
    // A list far longer than the job's node count is wrong whatever it says: stop expanding
    // there (a list a few hosts off is counted and named below).
    const std::size_t max_hosts =
        c.nnodes && row.host_list == HostList::kSlurm
            ? 2 * static_cast<std::size_t>(parse_count(c.nnodes->value).value_or(kMaxSlurmHosts)) +
                  1
            : kMaxSlurmHosts;
    hosts = row.host_list == HostList::kSlurm ? expand_slurm_hostlist(*v, row.hosts, max_hosts)
                                              : host_lines(*v);
    TY_CHECK(!hosts.empty(), row.hosts, " names no host.");
  }
  if (auto v = env_value(env, row.master_addr)) {
    c.master_addr = Sourced<std::string>{*v, row.master_addr};
    TY_CHECK(hosts.empty() || hosts.front() == *v, row.master_addr, "=", *v,
             " is not the first of ", row.hosts, " (", hosts.front(),
             "), node 0's. HINT: the job's variables disagree; give --master-addr.");
  } else if (!hosts.empty()) {
    c.master_addr =
        Sourced<std::string>{hosts.front(), detail::concat("the first host of ", row.hosts)};
  }

  const auto nodes = c.nnodes ? parse_count(c.nnodes->value) : std::nullopt;
  if (nodes && !hosts.empty())
    TY_CHECK(static_cast<long long>(hosts.size()) == *nodes, row.hosts, " names ", hosts.size(),
             " host(s) but ", row.nnodes, " is ", *nodes, ".");
  return c;  // the node rank against the count: once, after every engine is merged
}

// `into`'s setting, or `from`'s when `into` has none; both: they must be equal.
template <typename T>
void merge_setting(std::optional<Sourced<T>>& into,
                   const std::optional<Sourced<T>>& from,
                   const char* what) {
  if (!from) return;
  if (!into) {
    into = from;
    return;
  }
  TY_CHECK(into->value == from->value, into->source, "=", into->value, " and ", from->source, "=",
           from->value, " disagree on ", what,
           ". HINT: two engines' variables are set; unset the stale ones, or give the flag.");
}

}  // namespace

LaunchContract detect_launch_contract(const EnvLookup& env) {
  LaunchContract out;
  for (const auto& row : kEngines) {
    if (!engine_present(env, row)) continue;
    const auto c = read_engine(env, row);
    if (out.engine.empty()) {
      out.engine = c.engine;
      out.engine_source = c.engine_source;
    }
    merge_setting(out.nnodes, c.nnodes, "the number of nodes");
    merge_setting(out.node_rank, c.node_rank, "this node's rank");
    merge_setting(out.nproc_per_node, c.nproc_per_node, "the ranks per node");
    merge_setting(out.master_addr, c.master_addr, "node 0's address");
    merge_setting(out.master_port, c.master_port, "the master port");
    if (!out.run_id && c.run_id) out.run_id = c.run_id;  // ids differ by nature: the first wins
    merge_setting(out.rdzv_backend, c.rdzv_backend, "the rendezvous backend");
    merge_setting(out.rdzv_endpoint, c.rdzv_endpoint, "the rendezvous endpoint");
  }
  if (out.nnodes && out.node_rank) {
    if (const auto nodes = parse_count(out.nnodes->value))
      TY_CHECK(out.node_rank->value < *nodes, out.node_rank->source, "=", out.node_rank->value,
               " is not below ", out.nnodes->source, "=", *nodes,
               ": node ranks run from 0 to the node count - 1.");
  }
  return out;
}

namespace {

// Appends the expansion of `item` (one host pattern, commas only inside brackets) to `out`.
void expand_host_item(std::string_view item,
                      std::string_view what,
                      std::size_t max_hosts,
                      std::vector<std::string>& out,
                      const std::string& prefix = "") {
  const auto open = item.find('[');
  if (open == std::string_view::npos) {
    TY_CHECK(item.find(']') == std::string_view::npos, what, ": '", item, "' has ']' without '['.");
    TY_CHECK(out.size() < max_hosts, what, " names more than ", max_hosts, " hosts by '", item,
             "', more than the job can have. HINT: the list and the node count disagree; check "
             "the job's variables.");
    out.push_back(prefix + std::string(item));
    return;
  }
  const auto close = item.find(']', open);
  TY_CHECK(close != std::string_view::npos, what, ": '", item, "' opens '[' without closing it.");
  const std::string head = prefix + std::string(item.substr(0, open));
  const auto rest = item.substr(close + 1);
  std::string_view ranges = item.substr(open + 1, close - open - 1);
  TY_CHECK(!ranges.empty(), what, ": '", item, "' has an empty '[]'.");
  while (!ranges.empty()) {
    const auto comma = ranges.find(',');
    const auto range = ranges.substr(0, comma);
    ranges = comma == std::string_view::npos ? std::string_view() : ranges.substr(comma + 1);
    const auto dash = range.find('-');
    const auto lo_text = range.substr(0, dash);
    const auto hi_text = dash == std::string_view::npos ? lo_text : range.substr(dash + 1);
    const auto lo = parse_count(lo_text), hi = parse_count(hi_text);
    TY_CHECK(lo && hi && *lo >= 0 && *lo <= *hi, what, ": '", range, "' in '", item,
             "' is not a number or a range LOW-HIGH.");
    for (long long n = *lo;; ++n) {  // to hi inclusive; n <= hi would overflow at LLONG_MAX
      std::string digits = std::to_string(n);
      if (digits.size() < lo_text.size()) digits.insert(0, lo_text.size() - digits.size(), '0');
      expand_host_item(rest, what, max_hosts, out, head + digits);
      if (n == *hi) break;
    }
  }
}

}  // namespace

std::vector<std::string> expand_slurm_hostlist(std::string_view list,
                                               std::string_view what,
                                               std::size_t max_hosts) {
  std::vector<std::string> out;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= list.size(); ++i) {
    const char ch = i < list.size() ? list[i] : ',';
    if (ch == '[') ++depth;
    if (ch == ']') --depth;
    if (ch == ',' && depth == 0) {
      const auto item = list.substr(start, i - start);
      TY_CHECK(!item.empty(), what, ": '", list, "' has an empty host name.");
      expand_host_item(item, what, max_hosts, out);
      start = i + 1;
    }
  }
  TY_CHECK(depth == 0, what, ": '", list, "' has unbalanced brackets.");
  return out;
}

}  // namespace trainyard::elastic
