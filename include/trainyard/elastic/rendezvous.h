// Dynamic rendezvous: how the agents of a job (one per node) agree, round after round, on who
// takes part and in which order, as torchrun's c10d and etcd rendezvous do.
//
// Note [Rendezvous state]
// The whole state of a run is one JSON document in a key-value backend (a TCPStore hosted by one
// agent for "c10d", etcd for "etcd"), changed only by compare-and-set, so any number of agents can
// race on it safely. A round
//   - opens when the first node joins; nodes join until max_nodes have joined (it closes at once),
//     or min_nodes have joined and the last-call window has passed;
//   - is then complete: each participant's group rank is its position in join order; the node of
//     group rank 0 publishes the workers' MASTER_ADDR and MASTER_PORT in the state;
//   - ends when any agent starts the next round: after its workers failed, when a node that
//     joined a complete round waits in the wait list and the round has room for it, or when a
//     participant's keep-alive heartbeat is older than keep_alive_interval * keep_alive_max_attempt
//     (a dead node). Every agent watches the state while its workers run and restarts them in
//     the new round when the round number changes.
// A node that finishes its work is marked done (its silence then is not death); the run is closed
// when every participant is done or an agent gives up, and a closed run refuses joins from the
// agents of that run.
//
// Note [Job instances]
// The state carries a random instance id, made when a state is created fresh; every agent that
// completed a round remembers it (RendezvousInfo::job_instance, TRAINYARD_JOB_INSTANCE for the
// ranks). A new job reusing the run id must work, as torchrun's users expect after a finished job:
// an agent that has not yet been in a round of this state starts a fresh state (new instance,
// next round number, nobody joined) by compare-and-set when the state is closed and either every
// participant finished or no other node's heartbeat is alive, or when it is open and every
// heartbeat has been silent for longer than a backend outage its agents ride out plus the
// keep-alive window (backend_timeout + keep_alive_interval * keep_alive_max_attempt: right after an
// outage every heartbeat is old, yet the job lives). A closed state with live participants (an
// agent just gave up; the others are stopping) refuses the join. An agent of the old instance that
// finds the state replaced or closed gets RendezvousClosedError: its job is over.
//
// Note [Backend outages]
// Ranks do not need the backend while they train, so a backend that stops answering (etcd
// restarted, the store's host briefly unreachable) must not stop them. watch() and next_round()
// retry a failed call with exponential backoff (0.1 s doubling to 2 s), log a warning at most every
// 10 s with the time the backend has been unreachable, and give up (NetworkError stating the real
// time and attempts) only after backend_timeout of continuous failure. Heartbeats cannot be
// written during an outage, so for a grace period after it ends watch() does not take an expired
// heartbeat for a dead node.
//
// Note [Exit barrier]
// As torchrun's, an agent whose workers succeeded stays until every node is done (an agent that
// serves the c10d store must not pull it from under the others), for at most exit_barrier_timeout.
// It stops waiting sooner when waiting cannot end well: when another node ended the round (its
// workers failed after these finished), or when every node not yet done has stopped sending
// heartbeats (an agent killed, a host gone), outside the grace after a backend outage; and when
// the backend stops answering (the agent serving a c10d store has left a closed run).
//
// Note [Short last call]
// The last-call window waits for nodes that may still come. A node of the previous round whose
// heartbeat has expired will not: when every node of the previous round has either rejoined or
// is known dead, a round with min_nodes joined completes at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace trainyard::elastic {

// The storage under a rendezvous: one value with compare-and-set.
class RendezvousBackend {
 public:
  virtual ~RendezvousBackend() = default;
  // The stored state and a token that identifies this version of it; nullopt when none exists.
  virtual std::optional<std::pair<std::string, std::string>> get_state() = 0;
  // Stores `state` if the stored version is still `token` (nullopt: only if none exists).
  // Returns the state stored afterwards and its token, and whether `state` was written.
  struct SetResult {
    std::string state;
    std::string token;
    bool written = false;
  };
  virtual SetResult set_state(const std::string& state,
                              const std::optional<std::string>& token) = 0;
  // "c10d", "etcd", ... and where it is, for messages.
  virtual std::string describe() const = 0;
};

struct RendezvousOptions {
  std::string run_id = "none";
  int min_nodes = 1;
  int max_nodes = 1;
  std::string node_id;     // unique per agent; default: host name, pid and a random suffix
  std::string local_addr;  // how the other nodes reach this one (its workers' MASTER_ADDR)
  int local_world_size = 1;
  std::chrono::milliseconds join_timeout{600'000};      // to wait for a round to complete
  std::chrono::milliseconds last_call_timeout{30'000};  // after min_nodes joined
  std::chrono::milliseconds keep_alive_interval{5'000};
  int keep_alive_max_attempt = 3;
  std::chrono::milliseconds poll_interval{100};  // how often a waiting node reads the state
  // How long the backend may stay unreachable before a round (or a join) gives up on it; see
  // Note [Backend outages].
  std::chrono::milliseconds backend_timeout{60'000};
};

// What a completed round gives this node.
struct RendezvousInfo {
  std::int64_t round = 0;
  int group_rank = 0;        // this node's rank among the nodes
  int group_world_size = 1;  // nodes in the round
  int rank_offset = 0;       // global rank of this node's local rank 0
  int world_size = 1;        // workers over all nodes
  std::string master_addr;
  std::uint16_t master_port = 0;
  std::string job_instance;  // the state's instance id; see Note [Job instances]
};

// Why an agent must restart its workers, from watching the state while they run.
enum class RoundChange {
  kNone,
  kNewRound,           // another agent started the next round (a failure elsewhere, or a leave)
  kNodesWaiting,       // nodes wait to join and the round has room: this agent starts the next
  kParticipantLost,    // a participant's heartbeat expired: this agent starts the next round
  kBackendUnreachable  // the backend does not answer (yet): keep the ranks running and ask again
};

class Rendezvous {
 public:
  Rendezvous(std::unique_ptr<RendezvousBackend> backend, RendezvousOptions options);
  ~Rendezvous();

  // Joins the next round and waits for it to complete; then, on group rank 0, publishes
  // master_addr and a free port picked by `pick_port`. Throws RendezvousClosedError when the run
  // is closed and TimeoutError when no round completes within join_timeout. Returns nullopt,
  // having left the round, as soon as `interrupted` (asked while waiting) answers true.
  // A state whose heartbeats have all expired (a run id reused, or a run whose nodes all died),
  // or a finished one, is started afresh (Note [Job instances]). A backend outage shorter than
  // backend_timeout is ridden out; a longer one throws NetworkError.
  std::optional<RendezvousInfo> next_round(const std::function<std::uint16_t()>& pick_port,
                                           const std::function<bool()>& interrupted = {});

  // While the workers run: refreshes this node's heartbeat (at most once per keep_alive_interval)
  // and reports whether the round is over. Throws RendezvousClosedError when the run was closed
  // (or replaced by a new job with the same id), NetworkError when the backend has been
  // unreachable for backend_timeout (Note [Backend outages]). Blocks for at most one backend
  // call; during an outage's backoff it returns kBackendUnreachable without calling.
  RoundChange watch();

  // Ends the current round so that every agent re-rendezvous (after this node's workers failed,
  // or for the reasons watch() reports). False when the round had already ended (another node
  // ended it first: this node's failure may be a consequence of that).
  bool start_next_round(const std::string& why);

  // This node leaves for good: it is removed from the round, which ends, so the others continue
  // without it.
  void leave();

  // This node's workers finished; when every participant has, the run is closed.
  void mark_done();

  // Waits until the run is closed (every node done, or an agent gave up), the round is over, or
  // every node not done has gone silent (Note [Exit barrier]), refreshing this node's
  // heartbeat. False when `timeout` passed first.
  bool wait_closed(std::chrono::milliseconds timeout,
                   const std::function<bool()>& interrupted = {});

  // No more rounds: every agent's next join or watch throws RendezvousClosedError.
  void close(const std::string& why);

  int num_nodes_waiting();
  const RendezvousOptions& options() const { return options_; }
  const std::string& describe() const { return description_; }

 private:
  struct State;
  // One call of next_round: the phases of joining a round, as a state machine (rendezvous.cpp).
  class RoundJoin;
  // Reads, changes with `edit` and writes back by compare-and-set until it sticks. `edit`
  // returns false to leave the state as it is. Returns the state as finally stored.
  State update(const std::function<bool(State&)>& edit);
  State read();
  // read(), or, once keep_alive_interval has passed since the last one, a heartbeat update.
  State read_and_beat();
  // Runs `call` (backend work), retrying NetworkError with backoff until backend_timeout of
  // continuous failure or `interrupted`; see Note [Backend outages].
  template <typename F>
  auto ride_out(F&& call, const std::function<bool()>& interrupted) -> decltype(call());
  // Records a failed backend call; throws NetworkError once the outage is past backend_timeout.
  void note_outage(const std::string& error);
  void note_recovered();
  // True shortly after an outage, while expired heartbeats do not yet mean dead nodes.
  bool in_outage_grace() const;
  // The participants of s's round, other than this node, neither done nor beating.
  std::vector<std::string> lost_participants(const State& s) const;

  std::unique_ptr<RendezvousBackend> backend_;
  RendezvousOptions options_;
  std::string description_;
  std::int64_t round_ = -1;  // the round this node last completed
  std::chrono::steady_clock::time_point last_heartbeat_{};
  std::string instance_;  // the job instance of the rounds this node completed; "" before
  // The current backend outage (Note [Backend outages]), if any.
  std::optional<std::chrono::steady_clock::time_point> outage_since_;
  int outage_attempts_ = 0;
  std::chrono::steady_clock::time_point outage_retry_at_{};
  std::chrono::steady_clock::time_point outage_logged_at_{};
  std::chrono::steady_clock::time_point recovered_at_{};
  // While next_round runs: its join_timeout also ends an outage's retries.
  std::chrono::steady_clock::time_point join_deadline_ =
      std::chrono::steady_clock::time_point::max();
};

// Parses torchrun's --rdzv-conf "key=value,key=value" into options: join_timeout,
// last_call_timeout, close_timeout (accepted, unused), keep_alive_interval,
// keep_alive_max_attempt, backend_timeout (how long the backend may stay unreachable; Note
// [Backend outages]), read_timeout (accepted, unused). Times are seconds (fractions allowed).
void apply_rendezvous_conf(const std::string& conf, RendezvousOptions& options);

}  // namespace trainyard::elastic
