#include "run_metrics.h"

#include <chrono>
#include <mutex>
#include <utility>

#include "trainyard/cluster/api.h"
#include "trainyard/cluster/node_resources.h"
#include "trainyard/elastic/agent_metrics.h"
#include "trainyard/log.h"
#include "trainyard/metrics/names.h"
#include "trainyard/metrics/node_sampler.h"
#include "trainyard/net/http_server.h"

namespace trainyard::cli {

struct RunMetrics::Impl {
  RunMetricsOptions options;
  std::string node;  // the node label: this host's name
  elastic::AgentMetrics ranks;
  metrics::NodeSampler sampler;
  net::HttpServer server;

  explicit Impl(RunMetricsOptions o)
      : options(std::move(o)),
        node(cluster::local_hostname()),
        ranks(options.job),
        server(net::HttpServerOptions{
            .bind_address = options.bind_address, .port = options.port, .threads = 4}) {}

  std::mutex mu;
  std::chrono::steady_clock::time_point sampled{};  // guarded by mu
  metrics::Snapshot node_metrics;                   // guarded by mu

  // The node is sampled at most once per kMinSampleInterval: CPU is measured between two
  // samples, so several scrapers (an HA pair of Prometheus, a curl beside it) must not cut each
  // other's intervals short. The ranks' files are read on every scrape.
  static constexpr std::chrono::seconds kMinSampleInterval{1};
  net::ServerResponse scrape() {
    metrics::Snapshot all;
    {
      std::lock_guard<std::mutex> lock(mu);
      const auto now = std::chrono::steady_clock::now();
      if (now - sampled >= kMinSampleInterval) {
        node_metrics = sampler.sample(ranks.processes());
        sampled = now;
      }
      all = node_metrics;
    }
    metrics::merge_into(all, ranks.rank_snapshot());
    all = metrics::with_labels(std::move(all), {{std::string(metrics::name::kNodeLabel), node}});
    return net::ServerResponse{.status = 200,
                               .content_type = std::string(metrics::kPrometheusContentType),
                               .body = metrics::prometheus_text(all),
                               .headers = {}};
  }
};

RunMetrics::RunMetrics(RunMetricsOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {
  impl_->server.route("GET", std::string(cluster::api::kMetricsPath),
                      [this](const net::ServerRequest&) { return impl_->scrape(); });
  impl_->server.start();
  logger("run")->info("Metrics of this node and its ranks at http://{}:{}{}",
                      impl_->options.bind_address, impl_->server.port(),
                      cluster::api::kMetricsPath);
}

RunMetrics::~RunMetrics() {
  impl_->server.stop();
}

void RunMetrics::attach(elastic::LaunchOptions& options) {
  options.extra_env.push_back(impl_->ranks.env());
  options.on_event = [this, next = std::move(options.on_event)](const elastic::AgentEvent& e) {
    impl_->ranks.on_event(e);
    if (next) next(e);
  };
}

int RunMetrics::port() const {
  return impl_->server.port();
}

}  // namespace trainyard::cli
