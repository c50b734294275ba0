#include "trainyard/elastic/rendezvous.h"

#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "trainyard/error.h"
#include "trainyard/log.h"
#include "trainyard/seconds.h"

namespace trainyard::elastic {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

// Wall-clock milliseconds: heartbeats and deadlines are compared across nodes.
std::int64_t now_ms() {
  return std::chrono::duration_cast<milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// See Note [Backend outages].
constexpr milliseconds kOutageFirstBackoff{100};
constexpr milliseconds kOutageMaxBackoff{2'000};
constexpr milliseconds kOutageLogEvery{10'000};

double seconds_of(SteadyClock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// A random id for a fresh state; see Note [Job instances].
std::string new_instance() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}", rd(), rd());
}

std::string default_node_id() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::random_device rd;
  return detail::concat(host, ":", getpid(), ":", std::hex, rd() & 0xffffff);
}

struct Node {
  std::string id;
  std::string addr;
  int nproc = 1;
};

}  // namespace

// See Note [Rendezvous state].
struct Rendezvous::State {
  std::int64_t round = 0;
  bool complete = false;
  bool closed = false;
  bool finished = false;  // closed because every participant finished
  std::string closed_reason;
  std::string instance;               // see Note [Job instances]
  std::vector<std::string> previous;  // the last complete round's participants (ids)
  std::int64_t last_call_ms = 0;   // when the round completes once min_nodes have joined; 0: unset
  std::vector<Node> participants;  // in join order: group rank = position
  std::vector<Node> waiting;       // joined while the round was complete and full
  std::map<std::string, std::int64_t> heartbeats;
  std::set<std::string> done;
  std::string master_addr;  // published by group rank 0 once the round is complete
  int master_port = 0;
  std::optional<std::string> token;  // the backend's version; nullopt when nothing is stored

  static State parse(const std::string& text, std::string token) {
    State s;
    s.token = std::move(token);
    try {
      const auto j = nlohmann::json::parse(text);
      s.round = j.at("round").get<std::int64_t>();
      s.complete = j.at("complete").get<bool>();
      s.closed = j.at("closed").get<bool>();
      s.closed_reason = j.value("closed_reason", "");
      s.finished = j.value("finished", false);
      s.instance = j.value("instance", "");
      s.previous = j.value("previous", std::vector<std::string>{});
      s.last_call_ms = j.at("last_call_ms").get<std::int64_t>();
      auto nodes = [](const nlohmann::json& list) {
        std::vector<Node> out;
        for (const auto& n : list) out.push_back({n.at("id"), n.at("addr"), n.at("nproc")});
        return out;
      };
      s.participants = nodes(j.at("participants"));
      s.waiting = nodes(j.at("waiting"));
      s.heartbeats = j.at("heartbeats").get<std::map<std::string, std::int64_t>>();
      s.done = j.at("done").get<std::set<std::string>>();
      s.master_addr = j.at("master_addr").get<std::string>();
      s.master_port = j.at("master_port").get<int>();
    } catch (const std::exception& e) {
      throw CorruptDataError(
          detail::concat("The rendezvous state is not valid: ", e.what(),
                         ". HINT: another program uses the same key; pick another --rdzv-id."));
    }
    return s;
  }

  std::string dump() const {
    auto nodes = [](const std::vector<Node>& list) {
      nlohmann::json out = nlohmann::json::array();
      for (const auto& n : list)
        out.push_back({{"id", n.id}, {"addr", n.addr}, {"nproc", n.nproc}});
      return out;
    };
    return nlohmann::json{{"round", round},
                          {"complete", complete},
                          {"closed", closed},
                          {"closed_reason", closed_reason},
                          {"finished", finished},
                          {"instance", instance},
                          {"previous", previous},
                          {"last_call_ms", last_call_ms},
                          {"participants", nodes(participants)},
                          {"waiting", nodes(waiting)},
                          {"heartbeats", heartbeats},
                          {"done", done},
                          {"master_addr", master_addr},
                          {"master_port", master_port}}
        .dump();
  }

  int index_of(const std::string& id) const {
    for (std::size_t i = 0; i < participants.size(); ++i) {
      if (participants[i].id == id) return static_cast<int>(i);
    }
    return -1;
  }
  bool is_waiting(const std::string& id) const {
    return std::any_of(waiting.begin(), waiting.end(), [&](const Node& n) { return n.id == id; });
  }
  bool expired(const std::string& id, std::int64_t now, std::int64_t timeout_ms) const {
    auto it = heartbeats.find(id);
    return it == heartbeats.end() || now - it->second > timeout_ms;
  }
  // Heartbeat entries of nodes that are neither participants nor waiting and long silent.
  void forget_expired(std::int64_t now, std::int64_t timeout_ms) {
    std::erase_if(heartbeats, [&](const auto& h) {
      return index_of(h.first) < 0 && !is_waiting(h.first) && now - h.second > timeout_ms;
    });
  }
  // The next round: nobody has joined it yet.
  void advance() {
    if (complete) {
      previous.clear();
      for (const auto& n : participants) previous.push_back(n.id);
    }
    ++round;
    complete = false;
    last_call_ms = 0;
    participants.clear();
    done.clear();
    master_addr.clear();
    master_port = 0;
  }
};

Rendezvous::Rendezvous(std::unique_ptr<RendezvousBackend> backend, RendezvousOptions options)
    : backend_(std::move(backend)), options_(std::move(options)) {
  TY_CHECK(backend_ != nullptr, "Rendezvous needs a backend.");
  TY_CHECK(options_.min_nodes >= 1 && options_.min_nodes <= options_.max_nodes,
           "Rendezvous needs 1 <= min_nodes <= max_nodes, got ", options_.min_nodes, ":",
           options_.max_nodes, ".");
  TY_CHECK(options_.local_world_size >= 1, "Rendezvous local_world_size must be >= 1.");
  TY_CHECK(!options_.local_addr.empty(), "Rendezvous needs this node's address (local_addr).");
  TY_CHECK(options_.keep_alive_interval.count() > 0 && options_.keep_alive_max_attempt >= 1,
           "Rendezvous keep-alive interval must be > 0 and max attempts >= 1.");
  if (options_.node_id.empty()) options_.node_id = default_node_id();
  description_ = backend_->describe();
}

Rendezvous::~Rendezvous() = default;

Rendezvous::State Rendezvous::read() {
  auto got = backend_->get_state();
  if (!got) return State{};
  return State::parse(got->first, got->second);
}

Rendezvous::State Rendezvous::update(const std::function<bool(State&)>& edit) {
  State s = read();
  for (int attempt = 0;; ++attempt) {
    State changed = s;
    if (!edit(changed)) return s;
    auto result = backend_->set_state(changed.dump(), s.token);
    if (result.written) {
      changed.token = result.token;
      return changed;
    }
    s = State::parse(result.state, result.token);
    // Contention between a handful of agents settles in a few tries; back off a little.
    if (attempt > 3) std::this_thread::sleep_for(milliseconds(5 * std::min(attempt, 20)));
  }
}

void Rendezvous::note_outage(const std::string& error) {
  const auto now = SteadyClock::now();
  if (!outage_since_) {
    outage_since_ = now;
    outage_attempts_ = 0;
    outage_logged_at_ = now - kOutageLogEvery;
  }
  ++outage_attempts_;
  const double unreachable_s = seconds_of(now - *outage_since_);
  const bool backend_timed_out = now - *outage_since_ >= options_.backend_timeout;
  if (backend_timed_out || now >= join_deadline_) {
    const int attempts = outage_attempts_;
    outage_since_.reset();  // a later call (a rejoin) gets a whole backend_timeout again
    const std::string limit =
        backend_timed_out
            ? detail::concat("backend_timeout is ", options_.backend_timeout.count() / 1000.0, " s")
            : detail::concat("the join_timeout of ", options_.join_timeout.count() / 1000.0,
                             " s has passed while joining");
    throw NetworkError(detail::concat(
        "The rendezvous backend (", description_, ") has been unreachable for ",
        fmt::format("{:.1f}", unreachable_s), " s (", attempts, " failed attempt(s); ", limit,
        "). Last error: ", error, " HINT: raise --rdzv-conf ",
        backend_timed_out ? "backend_timeout" : "join_timeout",
        "=SECONDS to ride out longer outages."));
  }
  const auto backoff = std::min<milliseconds>(
      kOutageFirstBackoff * (1 << std::min(outage_attempts_ - 1, 10)), kOutageMaxBackoff);
  outage_retry_at_ = now + backoff;
  if (now - outage_logged_at_ >= kOutageLogEvery) {
    outage_logged_at_ = now;
    logger("rendezvous")
        ->warn(
            "The rendezvous backend ({}) has been unreachable for {:.1f} s ({} failed "
            "attempt(s)); retrying until {} s have passed (backend_timeout). Last error: {}",
            description_, unreachable_s, outage_attempts_,
            options_.backend_timeout.count() / 1000.0, error);
  }
}

void Rendezvous::note_recovered() {
  if (!outage_since_) return;
  const auto now = SteadyClock::now();
  logger("rendezvous")
      ->warn(
          "The rendezvous backend ({}) answers again after {:.1f} s unreachable ({} failed "
          "attempt(s)).",
          description_, seconds_of(now - *outage_since_), outage_attempts_);
  outage_since_.reset();
  recovered_at_ = now;
  last_heartbeat_ = {};  // beat at the next watch: the others may think this node dead
}

template <typename F>
auto Rendezvous::ride_out(F&& call, const std::function<bool()>& interrupted) -> decltype(call()) {
  while (true) {
    try {
      auto result = call();
      note_recovered();
      return result;
    } catch (const NetworkError& e) {
      note_outage(e.what());  // throws past backend_timeout
      while (SteadyClock::now() < outage_retry_at_) {
        if (interrupted && interrupted()) throw;
        std::this_thread::sleep_for(std::min<SteadyClock::duration>(
            options_.poll_interval, outage_retry_at_ - SteadyClock::now()));
      }
    }
  }
}

// One call of next_round: this node's way through a round, as the phases of Note [Rendezvous
// state]. It keeps the state as it last read it and moves it on by compare-and-set until the
// round is settled, the run is closed, join_timeout passes or `interrupted` answers true. While it
// lives, join_timeout also bounds an outage's retries (join_deadline_, read by note_outage).
class Rendezvous::RoundJoin {
 public:
  // Where this node stands in the state last read.
  enum class Phase {
    kJoining,           // in neither the round nor its wait list: join
    kWaitingForNodes,   // in an open round without a last call (min_nodes not joined): wait
    kLastCall,          // in an open round whose last-call window is running: wait
    kLastCallOver,      // ... the window has passed, or nobody else will come: complete the round
    kWaitingForRoom,    // in the wait list of a complete round that is full: wait
    kPublishingMaster,  // group rank 0 of a complete round: publish the workers' master address
    kWaitingForMaster,  // another group rank of a complete round: wait for that address
    kMasterLost,        // group rank 0 died before publishing it: start the next round
    kSettled,           // complete, with the master address: the round is this node's
    kClosed,            // the run is closed, or replaced by a new job's: throw
  };

  RoundJoin(Rendezvous& rdzv,
            const std::function<std::uint16_t()>& pick_port,
            const std::function<bool()>& interrupted);
  ~RoundJoin();
  RoundJoin(const RoundJoin&) = delete;
  RoundJoin& operator=(const RoundJoin&) = delete;

  // Joins, then moves from phase to phase until kSettled (the round's info) or kClosed.
  std::optional<RendezvousInfo> run();

 private:
  Phase current_phase() const;
  bool replaced(const State& s) const;
  [[noreturn]] void throw_closed() const;
  TimeoutError timeout_error() const;

  // s_ becomes the state as `edit` changed it by compare-and-set (Rendezvous::update), riding out
  // a backend outage (Note [Backend outages]).
  void change(const std::function<bool(State&)>& edit);
  void wait_and_read();
  // kJoining and its parts.
  void join();
  void start_afresh_if_over(State& s, std::int64_t now) const;
  bool must_wait_for_room(const State& s, std::int64_t now) const;
  void take_place(State& s, std::int64_t now) const;
  // kLastCall, kLastCallOver.
  bool rest_known_dead() const;
  bool complete_round();
  // kPublishingMaster, kMasterLost, kSettled.
  void publish_master();
  void start_over_without_master();
  RendezvousInfo settle();
  // Leaving, on the way out.
  void withdraw();
  void try_withdraw();

  Rendezvous& rdzv_;  // the caller of next_round, which outlives this
  const RendezvousOptions& options_;
  const std::string& me_;
  const Node self_;
  const std::int64_t dead_after_;  // ms of heartbeat silence after which a node is dead
  const SteadyClock::time_point give_up_;
  const std::function<std::uint16_t()>& pick_port_;
  const std::function<bool()>& interrupted_;
  State s_;  // the state as this node last read or wrote it
};

Rendezvous::RoundJoin::RoundJoin(Rendezvous& rdzv,
                                 const std::function<std::uint16_t()>& pick_port,
                                 const std::function<bool()>& interrupted)
    : rdzv_(rdzv),
      options_(rdzv.options_),
      me_(options_.node_id),
      self_{me_, options_.local_addr, options_.local_world_size},
      dead_after_(options_.keep_alive_interval.count() * options_.keep_alive_max_attempt),
      give_up_(SteadyClock::now() + options_.join_timeout),
      pick_port_(pick_port),
      interrupted_(interrupted) {
  // An outage while joining is ridden out no longer than the join may take.
  rdzv_.join_deadline_ = give_up_;
}

Rendezvous::RoundJoin::~RoundJoin() {
  rdzv_.join_deadline_ = SteadyClock::time_point::max();
}

std::optional<RendezvousInfo> Rendezvous::next_round(
    const std::function<std::uint16_t()>& pick_port, const std::function<bool()>& interrupted) {
  return RoundJoin(*this, pick_port, interrupted).run();
}

std::optional<RendezvousInfo> Rendezvous::RoundJoin::run() {
  join();
  if (replaced(s_) || s_.closed) throw_closed();
  logger("rendezvous")
      ->info("Node {} joined round {} of run '{}' ({}{} node(s) so far, {}..{} wanted).", me_,
             s_.round, options_.run_id, s_.is_waiting(me_) ? "waiting; " : "",
             s_.participants.size(), options_.min_nodes, options_.max_nodes);
  rdzv_.last_heartbeat_ = SteadyClock::now();
  while (true) {
    if (interrupted_ && interrupted_()) {
      try_withdraw();
      return std::nullopt;
    }
    if (SteadyClock::now() >= give_up_) {
      try_withdraw();
      throw timeout_error();
    }
    switch (current_phase()) {
      case Phase::kClosed:
        throw_closed();
      case Phase::kSettled:
        return settle();
      case Phase::kJoining:
        // The round moved on (or dropped this node), or a waiting node's chance came: join it.
        join();
        continue;
      case Phase::kPublishingMaster:
        publish_master();
        continue;
      case Phase::kMasterLost:
        start_over_without_master();
        continue;
      case Phase::kLastCallOver:
        if (complete_round()) continue;
        break;
      case Phase::kWaitingForNodes:
      case Phase::kLastCall:
      case Phase::kWaitingForRoom:
      case Phase::kWaitingForMaster:
        break;
    }
    wait_and_read();
  }
}

Rendezvous::RoundJoin::Phase Rendezvous::RoundJoin::current_phase() const {
  if (replaced(s_) || s_.closed) return Phase::kClosed;
  const int mine = s_.index_of(me_);
  if (s_.complete && mine >= 0) {
    if (!s_.master_addr.empty()) return Phase::kSettled;
    if (mine == 0) return Phase::kPublishingMaster;
    return s_.expired(s_.participants[0].id, now_ms(), dead_after_) ? Phase::kMasterLost
                                                                    : Phase::kWaitingForMaster;
  }
  if (s_.complete) return s_.is_waiting(me_) ? Phase::kWaitingForRoom : Phase::kJoining;
  if (mine < 0) return Phase::kJoining;
  if (s_.last_call_ms == 0) return Phase::kWaitingForNodes;
  return now_ms() >= s_.last_call_ms || rest_known_dead() ? Phase::kLastCallOver : Phase::kLastCall;
}

// See Note [Job instances].
bool Rendezvous::RoundJoin::replaced(const State& s) const {
  return s.token && !rdzv_.instance_.empty() && s.instance != rdzv_.instance_;
}

void Rendezvous::RoundJoin::throw_closed() const {
  if (replaced(s_)) {
    throw RendezvousClosedError(
        detail::concat("The rendezvous of run '", options_.run_id, "' (", rdzv_.description_,
                       ") was closed and a new ",
                       "job with the same run id started in it; this node's job (instance ",
                       rdzv_.instance_, ") is over."));
  }
  throw RendezvousClosedError(detail::concat("The rendezvous of run '", options_.run_id, "' (",
                                             rdzv_.description_, ") is closed: ", s_.closed_reason,
                                             "."));
}

TimeoutError Rendezvous::RoundJoin::timeout_error() const {
  return TimeoutError(
      detail::concat("No rendezvous round of run '", options_.run_id, "' completed within ",
                     options_.join_timeout.count() / 1000.0, " s (", rdzv_.description_,
                     "): ", s_.participants.size(), " node(s) joined, ", options_.min_nodes,
                     " needed. HINT: start the other nodes, or lower the minimum of --nnodes."));
}

void Rendezvous::RoundJoin::change(const std::function<bool(State&)>& edit) {
  s_ = rdzv_.ride_out([&] { return rdzv_.update(edit); }, interrupted_);
}

// The waiting phases: reads the state again after poll_interval, beating when due.
void Rendezvous::RoundJoin::wait_and_read() {
  std::this_thread::sleep_for(options_.poll_interval);
  s_ = rdzv_.ride_out([&] { return rdzv_.read_and_beat(); }, interrupted_);
}

// Adds this node to the round, or to the wait list of a complete, full one; a state that is over
// (Note [Job instances]) is first replaced by a fresh one.
void Rendezvous::RoundJoin::join() {
  change([&](State& s) {
    const auto now = now_ms();
    if (replaced(s)) return false;
    start_afresh_if_over(s, now);
    if (s.closed) return false;
    if (s.instance.empty()) s.instance = new_instance();  // a state written before instances
    s.heartbeats[me_] = now;
    std::erase_if(s.waiting,
                  [&](const Node& n) { return n.id != me_ && s.expired(n.id, now, dead_after_); });
    if (s.complete) {
      if (must_wait_for_room(s, now)) {
        if (!s.is_waiting(me_)) s.waiting.push_back(self_);
        return true;
      }
      s.advance();  // this node's workers failed, the round has room, or its nodes are gone
    } else {
      std::erase_if(s.participants, [&](const Node& n) {
        return n.id != me_ && s.expired(n.id, now, dead_after_);
      });
    }
    take_place(s, now);
    return true;
  });
}

// Replaces s by a fresh state (the next round number, nobody joined) when nothing is stored yet
// or the stored run is over for this node; see Note [Job instances].
void Rendezvous::RoundJoin::start_afresh_if_over(State& s, std::int64_t now) const {
  const bool mine = !rdzv_.instance_.empty();  // this node was in a round of this state
  // Nobody else of that run is alive (a run id reused, or a run whose nodes all died). For
  // another job's state, silence must also outlast a backend outage its agents ride out
  // (Note [Backend outages]): right after one, every heartbeat is old but the job lives.
  const auto silent_for =
      mine ? dead_after_
           : dead_after_ + static_cast<std::int64_t>(options_.backend_timeout.count());
  const bool stale = std::all_of(s.heartbeats.begin(), s.heartbeats.end(), [&](const auto& h) {
    return h.first == me_ || now - h.second > silent_for;
  });
  const bool fresh = !s.token || (s.closed ? !mine && (s.finished || stale) : stale);
  if (!fresh) return;
  State next{.round = s.token ? s.round + 1 : 0,
             .instance = mine ? rdzv_.instance_ : new_instance(),
             .token = s.token};
  // This node's own run, every other node silent: the last round's nodes are still known,
  // so the last call can be short (Note [Short last call]).
  if (mine) {
    s.advance();
    next.previous = std::move(s.previous);
  }
  s = std::move(next);
}

// In a complete round: whether this node joins its wait list rather than ending the round. Not
// when it is one of the round's nodes, when the round has room, or when its nodes are all done or
// gone.
bool Rendezvous::RoundJoin::must_wait_for_room(const State& s, std::int64_t now) const {
  const bool rejoining = s.index_of(me_) >= 0;
  const bool all_gone = std::all_of(
      s.participants.begin(), s.participants.end(),
      [&](const Node& n) { return s.done.contains(n.id) || s.expired(n.id, now, dead_after_); });
  return !rejoining && !all_gone && static_cast<int>(s.participants.size()) >= options_.max_nodes;
}

// Puts this node in s's open round, which completes at max_nodes and opens its last call at
// min_nodes; forgets the heartbeats of nodes long gone.
void Rendezvous::RoundJoin::take_place(State& s, std::int64_t now) const {
  s.forget_expired(now, dead_after_);
  std::erase_if(s.waiting, [&](const Node& n) { return n.id == me_; });
  if (s.index_of(me_) < 0) s.participants.push_back(self_);
  const int joined = static_cast<int>(s.participants.size());
  if (joined >= options_.max_nodes) {
    s.complete = true;
  } else if (joined >= options_.min_nodes && s.last_call_ms == 0) {
    s.last_call_ms = now + options_.last_call_timeout.count();
  }
}

// See Note [Short last call].
bool Rendezvous::RoundJoin::rest_known_dead() const {
  const auto now = now_ms();
  return !s_.previous.empty() &&
         std::all_of(s_.previous.begin(), s_.previous.end(), [&](const std::string& id) {
           return s_.index_of(id) >= 0 || s_.expired(id, now, dead_after_);
         });
}

// Ends the last call: the round completes with the nodes still alive, or waits for min_nodes again
// when too few are. False when the round had moved on or completed meanwhile.
bool Rendezvous::RoundJoin::complete_round() {
  const auto round = s_.round;
  bool changed = false;
  change([&](State& st) {
    if (st.round != round || st.complete) return false;
    const auto now = now_ms();
    std::erase_if(st.participants,
                  [&](const Node& n) { return n.id != me_ && st.expired(n.id, now, dead_after_); });
    if (static_cast<int>(st.participants.size()) >= options_.min_nodes) {
      st.complete = true;
    } else {
      st.last_call_ms = 0;  // too few left: wait for min_nodes again
    }
    return changed = true;
  });
  return changed;
}

// Picks the workers' master port and publishes it with this node's address.
void Rendezvous::RoundJoin::publish_master() {
  std::uint16_t port = 0;
  try {
    port = pick_port_();
  } catch (const Error&) {
    withdraw();  // the others would wait for an address that never comes
    throw;
  }
  const auto round = s_.round;
  change([&](State& st) {
    if (st.round != round || !st.master_addr.empty()) return false;
    st.master_addr = options_.local_addr;
    st.master_port = port;
    return true;
  });
}

void Rendezvous::RoundJoin::start_over_without_master() {
  // Group rank 0 died before publishing the master address: start over without it.
  const auto round = s_.round;
  change([&](State& st) {
    if (st.round != round) return false;
    st.advance();
    return true;
  });
}

// This node's place in the settled round; from now on the node is of its job instance.
RendezvousInfo Rendezvous::RoundJoin::settle() {
  RendezvousInfo info;
  info.round = s_.round;
  info.group_rank = s_.index_of(me_);
  info.group_world_size = static_cast<int>(s_.participants.size());
  for (int i = 0; i < info.group_world_size; ++i) {
    if (i < info.group_rank) info.rank_offset += s_.participants[i].nproc;
  }
  info.world_size = 0;
  for (const auto& n : s_.participants) info.world_size += n.nproc;
  info.master_addr = s_.master_addr;
  info.master_port = static_cast<std::uint16_t>(s_.master_port);
  info.job_instance = s_.instance;
  rdzv_.instance_ = s_.instance;
  rdzv_.round_ = s_.round;
  rdzv_.last_heartbeat_ = SteadyClock::now();
  return info;
}

// Leaves the round before giving up on it, so that it neither waits for nor counts this node.
void Rendezvous::RoundJoin::withdraw() {
  rdzv_.update([&](State& st) {
    if (st.closed) return false;
    std::erase_if(st.waiting, [&](const Node& n) { return n.id == me_; });
    if (st.index_of(me_) < 0) return true;
    if (st.complete) {
      st.advance();
    } else {
      std::erase_if(st.participants, [&](const Node& n) { return n.id == me_; });
      if (static_cast<int>(st.participants.size()) < options_.min_nodes) st.last_call_ms = 0;
    }
    return true;
  });
}

// Leaving is best effort when the backend is away: the round then ends without this node anyway.
void Rendezvous::RoundJoin::try_withdraw() {
  try {
    withdraw();
  } catch (const NetworkError& e) {
    logger("rendezvous")
        ->warn("Could not leave round {} of run '{}': {}", s_.round, options_.run_id, e.what());
  }
}

Rendezvous::State Rendezvous::read_and_beat() {
  if (SteadyClock::now() - last_heartbeat_ < options_.keep_alive_interval) return read();
  last_heartbeat_ = SteadyClock::now();
  return update([&](State& st) {
    if (st.closed || (!instance_.empty() && st.instance != instance_)) return false;
    st.heartbeats[options_.node_id] = now_ms();
    return true;
  });
}

RoundChange Rendezvous::watch() {
  const std::int64_t dead_after =
      options_.keep_alive_interval.count() * options_.keep_alive_max_attempt;
  // See Note [Backend outages].
  if (outage_since_ && SteadyClock::now() < outage_retry_at_)
    return RoundChange::kBackendUnreachable;
  State s;
  try {
    s = read_and_beat();
  } catch (const NetworkError& e) {
    note_outage(e.what());  // throws past backend_timeout
    return RoundChange::kBackendUnreachable;
  }
  note_recovered();
  if (s.closed) {
    throw RendezvousClosedError(detail::concat("The rendezvous of run '", options_.run_id,
                                               "' was closed: ", s.closed_reason, "."));
  }
  if (!instance_.empty() && s.instance != instance_) {
    throw RendezvousClosedError(detail::concat(
        "The rendezvous of run '", options_.run_id, "' was closed and a new job with the same ",
        "run id started in it (instance ", s.instance, ", this node's was ", instance_, ")."));
  }
  if (s.round != round_) return RoundChange::kNewRound;
  if (in_outage_grace()) return RoundChange::kNone;
  const auto now = now_ms();
  const bool waiting = std::any_of(s.waiting.begin(), s.waiting.end(), [&](const Node& n) {
    return !s.expired(n.id, now, dead_after);
  });
  if (waiting && static_cast<int>(s.participants.size()) < options_.max_nodes)
    return RoundChange::kNodesWaiting;
  return lost_participants(s).empty() ? RoundChange::kNone : RoundChange::kParticipantLost;
}

bool Rendezvous::in_outage_grace() const {
  // After an outage nobody could beat: give every node time to beat again first. A node beats at
  // its next watch, at most a keep-alive interval later (the launcher keeps its monitor interval
  // within it), after its own retry backoff.
  const auto dead_after = options_.keep_alive_interval * options_.keep_alive_max_attempt;
  return SteadyClock::now() - recovered_at_ <
         dead_after + kOutageMaxBackoff + options_.keep_alive_interval;
}

std::vector<std::string> Rendezvous::lost_participants(const State& s) const {
  const std::int64_t dead_after =
      options_.keep_alive_interval.count() * options_.keep_alive_max_attempt;
  const auto now = now_ms();
  std::vector<std::string> lost;
  for (const auto& n : s.participants) {
    if (n.id != options_.node_id && !s.done.contains(n.id) && s.expired(n.id, now, dead_after))
      lost.push_back(n.id);
  }
  return lost;
}

bool Rendezvous::start_next_round(const std::string& why) {
  const auto round = round_;
  bool ended_here = false;
  const auto s = update([&](State& st) {
    if (st.closed || st.round != round) return false;
    st.advance();
    return ended_here = true;
  });
  logger("rendezvous")
      ->info("Round {} of run '{}' is over ({}{}); next round {}.", round, options_.run_id, why,
             ended_here ? "" : ", already ended by another node", s.round);
  return ended_here;
}

void Rendezvous::leave() {
  const auto& me = options_.node_id;
  const auto round = round_;
  update([&](State& st) {
    if (st.closed) return false;
    const bool in_round = st.index_of(me) >= 0;
    std::erase_if(st.participants, [&](const Node& n) { return n.id == me; });
    std::erase_if(st.waiting, [&](const Node& n) { return n.id == me; });
    st.heartbeats.erase(me);
    if (in_round && st.complete && st.round == round) st.advance();
    return true;
  });
  logger("rendezvous")->info("Node {} left run '{}'.", me, options_.run_id);
}

void Rendezvous::mark_done() {
  const auto& me = options_.node_id;
  update([&](State& st) {
    if (st.closed || st.round != round_) return false;
    st.done.insert(me);
    st.heartbeats[me] = now_ms();
    if (std::all_of(st.participants.begin(), st.participants.end(),
                    [&](const Node& n) { return st.done.contains(n.id); })) {
      st.closed = true;
      st.finished = true;
      st.closed_reason = "every node finished";
    }
    return true;
  });
}

bool Rendezvous::wait_closed(std::chrono::milliseconds timeout,
                             const std::function<bool()>& interrupted) {
  // See Note [Exit barrier].
  const auto& me = options_.node_id;
  const auto give_up = SteadyClock::now() + timeout;
  while (SteadyClock::now() < give_up && !(interrupted && interrupted())) {
    State s;
    try {
      s = read_and_beat();
    } catch (const NetworkError& e) {
      // The agent serving a c10d store leaves once the run is closed; nothing left to wait for.
      logger("rendezvous")
          ->info(
              "The rendezvous backend ({}) went away after this node finished; not waiting "
              "further ({}).",
              description_, e.what());
      return true;
    }
    if (s.closed || (!instance_.empty() && s.instance != instance_)) return true;
    if (s.round != round_) {
      logger("rendezvous")
          ->warn(
              "Another node ended round {} of run '{}' after this node finished; not waiting "
              "for the nodes of round {}.",
              round_, options_.run_id, s.round);
      return true;
    }
    const auto lost = lost_participants(s);
    const auto unfinished =
        std::count_if(s.participants.begin(), s.participants.end(),
                      [&](const Node& n) { return n.id != me && !s.done.contains(n.id); });
    if (!lost.empty() && static_cast<std::size_t>(unfinished) == lost.size() &&
        !in_outage_grace()) {
      logger("rendezvous")
          ->warn(
              "Not waiting for node(s) {} of run '{}': each stopped sending heartbeats before "
              "finishing (none for over {} s). Its workers may not have finished; see that node's "
              "log.",
              fmt::join(lost, ", "), options_.run_id,
              (options_.keep_alive_interval * options_.keep_alive_max_attempt).count() / 1000.0);
      return true;
    }
    std::this_thread::sleep_for(options_.poll_interval);
  }
  return false;
}

void Rendezvous::close(const std::string& why) {
  update([&](State& st) {
    if (st.closed) return false;
    st.closed = true;
    st.closed_reason = why;
    return true;
  });
}

int Rendezvous::num_nodes_waiting() {
  const auto s = read();
  return static_cast<int>(s.waiting.size());
}

void apply_rendezvous_conf(const std::string& conf, RendezvousOptions& options) {
  auto seconds = [&](const std::string& key, const std::string& value) {
    const auto parsed = parse_seconds(value, 0, 1e7);
    TY_CHECK(parsed && parsed->count() > 0, "--rdzv-conf ", key,
             " must be a positive number of seconds, got '", value, "'.");
    return *parsed;
  };
  std::size_t begin = 0;
  while (begin < conf.size()) {
    auto end = std::min(conf.find(',', begin), conf.size());
    const std::string item = conf.substr(begin, end - begin);
    begin = end + 1;
    if (item.empty()) continue;
    const auto eq = item.find('=');
    TY_CHECK(eq != std::string::npos,
             "--rdzv-conf takes key=value pairs separated by commas, got '", item, "'.");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "join_timeout") {
      options.join_timeout = seconds(key, value);
    } else if (key == "last_call_timeout") {
      options.last_call_timeout = seconds(key, value);
    } else if (key == "keep_alive_interval") {
      options.keep_alive_interval = seconds(key, value);
    } else if (key == "backend_timeout") {
      options.backend_timeout = seconds(key, value);
    } else if (key == "keep_alive_max_attempt") {
      const int n = std::atoi(value.c_str());
      TY_CHECK(n >= 1 && std::to_string(n) == value,
               "--rdzv-conf keep_alive_max_attempt must be a whole number >= 1, got '", value,
               "'.");
      options.keep_alive_max_attempt = n;
    } else if (key == "close_timeout" || key == "read_timeout" || key == "timeout" ||
               key == "is_host") {
      // Accepted for torchrun compatibility; this agent does not need them.
    } else {
      throw InvalidArgumentError(detail::concat(
          "Unknown --rdzv-conf key '", key,
          "'. HINT: known keys are join_timeout, last_call_timeout, keep_alive_interval, "
          "keep_alive_max_attempt, backend_timeout."));
    }
  }
}

}  // namespace trainyard::elastic
