#include "trainyard/cluster/head.h"

#include "cluster/head_impl.h"
#include "trainyard/cluster/auth.h"
#include "trainyard/error.h"
#include "trainyard/net/base_url.h"

namespace trainyard::cluster {

using namespace head_detail;

std::string node_short_id(const std::string& node_id) {
  return node_id.size() <= 12 ? node_id : node_id.substr(0, 8);
}

std::string log_line_prefix(const std::string& node_id, int rank) {
  return "[" + node_short_id(node_id) + ":" + std::to_string(rank) + "] ";
}

void validate(const HeadOptions& o) {
  TY_CHECK(!o.state_dir.empty(), "HeadOptions.state_dir is empty: give the head a directory for ",
           "its database (--state-dir).");
  TY_CHECK(o.port >= 0 && o.port <= 65535, "HeadOptions.port must be in [0, 65535]; got ", o.port,
           ".");
  TY_CHECK(o.heartbeat_interval.count() > 0, "HeadOptions.heartbeat_interval must be positive; ",
           "got ", o.heartbeat_interval.count(), " ms.");
  TY_CHECK(o.suspect_after.count() >= 0, "HeadOptions.suspect_after must not be negative; got ",
           o.suspect_after.count(), " ms.");
  auto suspect = o.suspect_after.count() > 0 ? o.suspect_after : 3 * o.heartbeat_interval;
  TY_CHECK(o.dead_after > suspect, "HeadOptions.dead_after (", o.dead_after.count(),
           " ms) must be longer than suspect_after (", suspect.count(), " ms).");
  TY_CHECK(o.tick_interval.count() > 0, "HeadOptions.tick_interval must be positive; got ",
           o.tick_interval.count(), " ms.");
  TY_CHECK(o.history_points >= 2, "HeadOptions.history_points must be at least 2; got ",
           o.history_points, ".");
  TY_CHECK(o.max_log_followers_per_job >= 1 && o.max_log_followers >= 1,
           "HeadOptions.max_log_followers_per_job (", o.max_log_followers_per_job,
           ") and max_log_followers (", o.max_log_followers, ") must be at least 1.");
  TY_CHECK(o.http_threads >= 2, "HeadOptions.http_threads must be at least 2; got ", o.http_threads,
           ".");
  TY_CHECK(!(o.unauthenticated && o.token), "HeadOptions.unauthenticated is set together with a ",
           "token: give --token-file (or TRAINYARD_TOKEN) or --insecure-no-token, not both.");
  if (o.unauthenticated && !is_loopback_address(o.bind_address)) {
    throw InvalidArgumentError(
        "--bind " + o.bind_address +
        " listens beyond this machine, and --insecure-no-token would let anyone who reaches it "
        "run commands on the workers. Hint: drop --insecure-no-token (the head then makes a "
        "token, or give one with --token-file), or bind 127.0.0.1.");
  }
}

Head::Head(HeadOptions options) : impl_(std::make_unique<Impl>()) {
  validate(options);
  impl_->o = std::move(options);
  impl_->history = std::make_unique<MetricsHistory>(MetricsHistoryOptions{
      .points = impl_->o.history_points,
      .max_age_s = impl_->o.history_points *
                   std::chrono::duration<double>(impl_->o.heartbeat_interval).count()});
  impl_->suspect_after =
      impl_->o.suspect_after.count() > 0 ? impl_->o.suspect_after : 3 * impl_->o.heartbeat_interval;
}

Head::~Head() {
  stop();
}

void Head::start() {
  Impl& m = *impl_;
  TY_CHECK(!m.server, "Head::start() was called twice.");
  m.state_dir = std::make_unique<StateDir>(m.o.state_dir, "trainyard head");
  // Note [A token file only its user controls] (auth.cpp).
  if (m.o.token) check_token_strength(*m.o.token, "The head's --token-file or TRAINYARD_TOKEN");
  // Note [Secure by default] (auth.cpp).
  if (!m.o.token && !m.o.unauthenticated) {
    m.generated_token_file = m.o.state_dir / kGeneratedTokenFile;
    auto generated = load_or_create_token(m.generated_token_file);
    check_token_strength(generated.token, m.generated_token_file.string());
    m.o.token = std::move(generated.token);
    m.token_made = generated.made;
  }
  m.store = std::make_unique<JobStore>(m.o.state_dir);
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.nodes.clear();
    m.jobs.clear();
    double now = now_seconds();
    for (NodeRecord& n : m.store->list_nodes()) {
      if (n.state == api::kNodeAlive || n.state == api::kNodeSuspect ||
          n.state == api::kNodePending) {
        n.state = api::kNodePending;  // until it registers again (Note [Head state])
        n.state_since = now;
        m.store->put_node(n);
      }
      m.nodes[n.node_id] = n;
    }
    for (JobRecord& j : m.store->list_jobs()) m.jobs[j.job_id] = std::move(j);
    // What a node that is gone reported running holds nothing (Note [Head state]); an older head
    // kept such reservations.
    for (auto& [id, n] : m.nodes) {
      if (node_is_up(n.state)) continue;
      for (JobRecord* j : m.jobs_in_order()) m.release_node(*j, id);
    }
  }
  m.server = std::make_unique<net::HttpServer>(net::HttpServerOptions{
      .bind_address = m.o.bind_address,
      .port = m.o.port,
      .threads = m.o.http_threads,
      // Followers beyond the head's own caps are refused by it with a reason (429).
      .max_websockets = m.o.max_log_followers + 16});
  m.add_routes();
  try {
    m.server->start();
  } catch (...) {
    m.server.reset();
    m.store.reset();
    m.state_dir.reset();
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(m.tick_mu);
    m.stopping = false;
  }
  {
    std::lock_guard<std::mutex> lock(m.tails_mu);
    m.stopping_tails = false;
  }
  m.ticker = std::thread([&m] {
    std::unique_lock<std::mutex> lock(m.tick_mu);
    while (!m.stopping) {
      m.tick_cv.wait_for(lock, m.o.tick_interval, [&m] { return m.stopping; });
      if (m.stopping) break;
      lock.unlock();
      try {
        m.tick();
      } catch (const StoreFullError& e) {
        // Once per kStoreFullLogEvery while it lasts (Note [A full disk]).
        const auto now = std::chrono::steady_clock::now();
        if (now - m.store_full_logged_at >= Impl::kStoreFullLogEvery) {
          m.store_full_logged_at = now;
          m.log->error("{} (said at most every {} s while it lasts)", e.what(),
                       Impl::kStoreFullLogEvery.count());
        }
      } catch (const std::exception& e) {
        m.log->error("the head's tick failed: {}", e.what());
      }
      lock.lock();
    }
  });
  m.tail_pumper = std::thread([&m] {
    std::unique_lock<std::mutex> lock(m.tails_mu);
    while (!m.stopping_tails) {
      m.tails_cv.wait_for(lock, m.o.tick_interval,
                          [&m] { return m.tails_wanted || m.stopping_tails; });
      if (m.stopping_tails) break;
      m.tails_wanted = false;
      lock.unlock();
      try {
        m.pump_tails("");
      } catch (const std::exception& e) {
        m.log->error("pumping the log tails failed: {}", e.what());
      }
      lock.lock();
    }
  });
  if (m.o.unauthenticated) {
    m.log->warn(
        "head listening on {} WITHOUT AUTHENTICATION (--insecure-no-token): every user and "
        "container that shares this host's loopback can submit jobs, which run as this user on "
        "the workers (state in {})",
        url(), m.store->path().string());
  } else {
    m.log->info(
        "head listening on {} (state in {}, token required{})", url(), m.store->path().string(),
        m.generated_token_file.empty()
            ? ""
            : (m.token_made ? ": made in " : ": kept in ") + m.generated_token_file.string());
  }
}

void Head::stop() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.tick_mu);
    m.stopping = true;
  }
  m.tick_cv.notify_all();
  if (m.ticker.joinable()) m.ticker.join();
  {
    std::lock_guard<std::mutex> lock(m.tails_mu);
    m.stopping_tails = true;
  }
  m.tails_cv.notify_all();
  if (m.tail_pumper.joinable()) m.tail_pumper.join();
  if (m.server) {
    m.server->stop();
    m.server.reset();
  }
  {
    std::lock_guard<std::mutex> lock(m.tails_mu);
    m.tails.clear();
  }
  m.store.reset();
  m.state_dir.reset();  // another head may take the folder now
}

const std::optional<std::string>& Head::token() const {
  return impl_->o.token;
}

std::filesystem::path Head::generated_token_file() const {
  return impl_->generated_token_file;
}

int Head::port() const {
  return impl_->server ? impl_->server->port() : 0;
}

std::string Head::url() const {
  const std::string& bind = impl_->o.bind_address;
  // Every interface includes loopback, which is where this process reaches itself.
  return net::http_url(bind == "0.0.0.0" ? "127.0.0.1" : bind == "::" ? "::1" : bind, port());
}

nlohmann::json Head::status() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->status_snapshot();
}

}  // namespace trainyard::cluster
