#include "trainyard/cluster/head_client.h"

#include <chrono>
#include <cstdlib>
#include <utility>

#include "trainyard/cluster/auth.h"
#include "trainyard/env.h"
#include "trainyard/log.h"
#include "trainyard/net/base_url.h"
#include "trainyard/net/http_client.h"

namespace trainyard::cluster {
namespace {

using nlohmann::json;

// The head's own message from an error answer ({"error": "..."}), or the body.
std::string message_of(const std::string& body) {
  try {
    const json j = json::parse(body);
    if (j.is_object() && j.contains("error") && j["error"].is_string()) return j["error"];
  } catch (const json::exception&) {
  }
  return net::excerpt(body);
}

// Note [Clients ride out a head restart]
// A head restarts (an upgrade, a crash, its node rebooting) while jobs go on: the workers keep
// their ranks and report again when it is back, and its state directory keeps the jobs. A client
// that gave up after three attempts in 0.3 s would report a failure for a job that then
// succeeds. So with HeadClientOptions::ride_out, a call retries for that long, with back-off
// from 250 ms to 5 s; its warnings say what failed, how long it has tried and how long it will,
// and once the head answers, how long it was away. A POST that may have reached the head is
// retried only when the caller made it idempotent: `trainyard submit` does, by naming the job
// itself (a 409 at a later attempt is then its own submission, Note [A submission that
// landed]).
constexpr std::chrono::milliseconds kRideOutFirstPause{250};
constexpr std::chrono::milliseconds kRideOutLongestPause{5'000};
constexpr std::chrono::seconds kRideOutWarnEvery{5};

double seconds_of(std::chrono::milliseconds ms) {
  return std::chrono::duration<double>(ms).count();
}

}  // namespace

HeadClient::HeadClient(HeadClientOptions options)
    : options_(std::move(options)),
      base_(net::base_url(options_.address, kDefaultHeadPort, "The head's address")),
      http_(std::make_unique<net::HttpClient>()) {}

HeadClient::~HeadClient() = default;

json HeadClient::get(std::string_view path) {
  return call("GET", path, nullptr, true);
}

json HeadClient::post(std::string_view path, const json& body, bool idempotent) {
  return call("POST", path, &body, idempotent);
}

json HeadClient::del(std::string_view path) {
  return call("DELETE", path, nullptr, false);
}

json HeadClient::call(const char* method,
                      std::string_view path,
                      const json* body,
                      bool idempotent) {
  net::HttpRequest request{.method = method, .url = base_ + std::string(path)};
  if (body != nullptr) {
    // A rank may print bytes that are not UTF-8: they travel as U+FFFD rather than failing.
    request.body = body->dump(-1, ' ', false, json::error_handler_t::replace);
    request.headers.emplace_back("Content-Type", "application/json");
  }
  if (options_.token) request.headers.emplace_back("Authorization", "Bearer " + *options_.token);
  request.connect_timeout = options_.connect_timeout;
  request.timeout = options_.timeout;
  net::RetryPolicy retry;
  retry.max_attempts = idempotent ? options_.max_attempts : 1;
  const bool ride_out = idempotent && options_.ride_out.count() > 0;
  if (ride_out) {
    retry.max_attempts = 0;
    retry.deadline = options_.ride_out;
    retry.backoff = kRideOutFirstPause;
    retry.backoff_max = kRideOutLongestPause;
    retry.on_retry = [this, last_warning = std::chrono::steady_clock::time_point()](
                         const net::RetryPolicy::Retry& r) mutable {
      const auto now = std::chrono::steady_clock::now();
      if (r.failed_attempt > 1 && now - last_warning < kRideOutWarnEvery) return;
      last_warning = now;
      logger("client")->warn(
          "The trainyard head at {} does not answer ({}); retrying for up to {:.0f} s ({:.1f} s "
          "so far).",
          base_, r.what, seconds_of(options_.ride_out), seconds_of(r.elapsed));
    };
  }
  const auto started = std::chrono::steady_clock::now();
  net::HttpResponse r;
  try {
    r = http_->send(request, retry);
  } catch (const net::HttpError& e) {
    // Retries that ended on an answer (a 5xx) report the answer; the others could not reach it.
    if (!e.last_response()) {
      throw NetworkError(detail::concat(
          "Cannot reach the trainyard head at ", base_, ": ", e.what(),
          " HINT: is `trainyard head` running there? Pass --address or set ", kAddressEnv, "."));
    }
    r = *e.last_response();
  }
  if (ride_out && r.attempt > 1)
    logger("client")->info(
        "The trainyard head at {} answers again (after {:.1f} s).", base_,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  const std::string what = detail::concat(method, " ", path);
  switch (r.status) {
    case 200:
    case 201:
      break;
    case 401:
      throw Error(detail::concat("The head at ", base_, " wants a token for ", what,
                                 " (HTTP 401). HINT: pass ", "--token-file or set ", kTokenEnv,
                                 "; a head started without a token made one in its ",
                                 "--state-dir (", kGeneratedTokenFile,
                                 ", by default ~/.trainyard/head/", kGeneratedTokenFile, ")."));
    case 403:
      throw Error(detail::concat("The head at ", base_, " refused ", what,
                                 " (HTTP 403: ", message_of(r.body),
                                 "). HINT: the token does not match the head's (its "
                                 "--token-file, or the one it made in its --state-dir)."));
    case 404:
      throw NotFoundError(message_of(r.body));
    case 400:
      throw InvalidArgumentError(message_of(r.body));
    case 409:
      throw ConflictError(message_of(r.body), r.attempt);
    default:
      throw Error(detail::concat("The head at ", base_, " answered ", what, " with HTTP ", r.status,
                                 ": ", message_of(r.body)));
  }
  if (r.body.empty()) return nullptr;
  try {
    return json::parse(r.body);
  } catch (const json::exception&) {
    throw Error(detail::concat("The head at ", base_, " answered ", what,
                               " with a body that is not JSON: ", net::excerpt(r.body)));
  }
}

std::string resolve_address(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* env = std::getenv(kAddressEnv); env != nullptr && *env != '\0') return env;
  return "http://127.0.0.1:" + std::to_string(kDefaultHeadPort);
}

std::optional<std::string> resolve_token(const std::string& token_file_flag) {
  if (!token_file_flag.empty()) return load_token(token_file_flag);
  if (const char* env = std::getenv(kTokenEnv); env != nullptr && *env != '\0') return env;
  // A head on this host in its default state directory (Note [Secure by default]).
  try {
    const auto local = default_head_state_dir() / kGeneratedTokenFile;
    if (std::filesystem::exists(local)) return load_token(local);
  } catch (const InvalidArgumentError&) {
    // No home directory: no local head's token to find.
  }
  return std::nullopt;
}

}  // namespace trainyard::cluster
