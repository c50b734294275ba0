// The rendezvous backend served by a trainyard head; see head_backend.h.
#include "trainyard/elastic/head_backend.h"

#include <nlohmann/json.hpp>
#include <utility>

#include "trainyard/error.h"
#include "trainyard/net/base_url.h"
#include "trainyard/net/http_client.h"

namespace trainyard::elastic {
namespace {

using nlohmann::json;

constexpr int kHeadDefaultPort = 8265;
constexpr const char* kStateField = "state";
constexpr const char* kTokenField = "token";
constexpr const char* kWrittenField = "written";

class HeadBackend final : public RendezvousBackend {
 public:
  explicit HeadBackend(HeadBackendOptions options)
      : options_(std::move(options)),
        url_(net::base_url(options_.head, kHeadDefaultPort, "HeadBackendOptions.head") +
             kHeadRendezvousPath + options_.run_id) {}

  std::optional<std::pair<std::string, std::string>> get_state() override {
    const net::HttpResponse r = call("GET", "");
    if (r.status == 404) return std::nullopt;
    const json answer = parse(r, "GET");
    return read(answer, "GET", [&] {
      auto st = answer.get<HeadRdzvState>();
      return std::make_pair(std::move(st.state), std::move(st.token));
    });
  }

  SetResult set_state(const std::string& state, const std::optional<std::string>& token) override {
    const json body = HeadRdzvWrite{.state = state, .token = token};
    const net::HttpResponse r = call("POST", body.dump());
    const json answer = parse(r, "POST");
    return read(answer, "POST", [&] {
      auto st = answer.get<HeadRdzvState>();
      TY_CHECK(st.written.has_value(), "The answer has no 'written' field.");
      return SetResult{
          .state = std::move(st.state), .token = std::move(st.token), .written = *st.written};
    });
  }

  std::string describe() const override { return "the trainyard head at " + url_; }

 private:
  net::HttpResponse call(const char* method, std::string body) {
    net::HttpRequest request{.method = method, .url = url_, .body = std::move(body)};
    request.headers.emplace_back("Content-Type", "application/json");
    if (options_.token) request.headers.emplace_back("Authorization", "Bearer " + *options_.token);
    request.connect_timeout = options_.timeout;
    request.timeout = options_.timeout;
    net::RetryPolicy retry;
    retry.max_attempts = options_.max_attempts;
    try {
      return client_.send(request, retry);
    } catch (const net::HttpError& e) {
      // Every attempt failed; one that ended on an answer (a 5xx) is reported as that answer.
      if (!e.last_response()) throw;
      return *e.last_response();
    }
  }

  json parse(const net::HttpResponse& r, const char* method) const {
    if (r.status == 401 || r.status == 403) {
      throw Error(detail::concat(describe(), " refused the rendezvous ", method, " (HTTP ",
                                 r.status, "): ", net::excerpt(r.body),
                                 " HINT: the worker's token does not match the head's."));
    }
    if (r.status >= 500 || r.status == 408 || r.status == 429) {
      // The head restarting, a proxy in front of it, a busy disk: an outage the rendezvous rides
      // out (Note [Backend outages]), not the end of the job.
      throw NetworkError(detail::concat(describe(), " answered the rendezvous ", method,
                                        " with HTTP ", r.status, ": ", net::excerpt(r.body)));
    }
    if (r.status != 200) {
      throw Error(detail::concat(describe(), " answered the rendezvous ", method, " with HTTP ",
                                 r.status, ": ", net::excerpt(r.body)));
    }
    try {
      return json::parse(r.body);
    } catch (const json::exception&) {
      throw Error(detail::concat(describe(), " answered the rendezvous ", method,
                                 " with a body that is not JSON: ", net::excerpt(r.body)));
    }
  }

  template <typename F>
  auto read(const json& answer, const char* method, F&& f) const -> decltype(f()) {
    try {
      return f();
    } catch (const std::exception& e) {
      throw Error(detail::concat(describe(), " answered the rendezvous ", method,
                                 " with JSON trainyard cannot read (", e.what(),
                                 "): ", net::excerpt(answer.dump())));
    }
  }

  HeadBackendOptions options_;
  std::string url_;
  net::HttpClient client_;  // thread-safe
};

}  // namespace

void to_json(json& j, const HeadRdzvWrite& v) {
  j = json{{kStateField, v.state}, {kTokenField, v.token ? json(*v.token) : json(nullptr)}};
}

void from_json(const json& j, HeadRdzvWrite& v) {
  const auto st = j.is_object() ? j.find(kStateField) : j.end();
  TY_CHECK(st != j.end() && st->is_string(), "The field 'state' must be a string.");
  v.state = st->get<std::string>();
  v.token.reset();
  if (const auto t = j.find(kTokenField); t != j.end() && !t->is_null()) {
    TY_CHECK(t->is_string(), "The field 'token' must be a string or null.");
    v.token = t->get<std::string>();
  }
}

void to_json(json& j, const HeadRdzvState& v) {
  j = json{{kStateField, v.state}, {kTokenField, v.token}};
  if (v.written) j[kWrittenField] = *v.written;
}

void from_json(const json& j, HeadRdzvState& v) {
  TY_CHECK(j.is_object(), "The rendezvous answer must be a JSON object.");
  const auto st = j.find(kStateField);
  const auto t = j.find(kTokenField);
  TY_CHECK(st != j.end() && st->is_string() && t != j.end() && t->is_string(),
           "The rendezvous answer needs the strings 'state' and 'token'.");
  v.state = st->get<std::string>();
  v.token = t->get<std::string>();
  v.written.reset();
  if (const auto w = j.find(kWrittenField); w != j.end() && w->is_boolean())
    v.written = w->get<bool>();
}

std::unique_ptr<RendezvousBackend> make_head_backend(HeadBackendOptions options) {
  TY_CHECK_T(InvalidArgumentError, !options.run_id.empty(),
             "HeadBackendOptions.run_id is empty; the head keeps one state per job id.");
  TY_CHECK_T(InvalidArgumentError, options.run_id.find_first_of("/?# ") == std::string::npos,
             "HeadBackendOptions.run_id '", options.run_id,
             "' holds a character that cannot be part of a URL path ('/', '?', '#' or a space).");
  TY_CHECK_T(InvalidArgumentError, options.max_attempts >= 1, "HeadBackendOptions.max_attempts is ",
             options.max_attempts, "; it must be >= 1.");
  return std::make_unique<HeadBackend>(std::move(options));
}

}  // namespace trainyard::elastic
