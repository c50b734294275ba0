#include "run_metrics.h"

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

  // Each scrape samples the node (CPU is measured since the previous scrape) and reads the
  // ranks' latest files.
  net::ServerResponse scrape() {
    metrics::Snapshot all = sampler.sample(ranks.processes());
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
