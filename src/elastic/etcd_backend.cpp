// The etcd rendezvous backend over etcd's JSON gateway; see etcd_backend.h.
#include "trainyard/elastic/etcd_backend.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>

#include "trainyard/error.h"
#include "trainyard/log.h"
#include "trainyard/net/http_client.h"

namespace trainyard::elastic {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr milliseconds kBackoff{50};  // after the first failure; doubled after each
constexpr milliseconds kMaxBackoff{1'000};

// Note [etcd JSON gateway]
// etcd (3.4 serves it at /v3/, 3.2 and 3.3 at /v3beta/) maps each gRPC call to a POST of the
// protobuf message as JSON, with protobuf's JSON conventions:
//   - bytes fields (key, value) are base64, both ways;
//   - int64 fields (revision, mod_revision, create_revision) are JSON strings in answers;
//     requests take strings or numbers, so the token travels back as the string it came as;
//   - fields holding their zero value are left out of answers: a failed txn has no "succeeded",
//     an empty value no "value", a range that found nothing no "kvs";
//   - answers use the proto field names (response_range); requests take those or camelCase
//     (requestPut).
// A txn's header revision is the store's revision after it, which for a txn whose only write is
// our put is that put's mod_revision: the new token.

std::string base64_encode(std::string_view in) {
  std::string out(4 * ((in.size() + 2) / 3) + 1, '\0');  // + the NUL EVP_EncodeBlock writes
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()),
                                static_cast<int>(in.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

// EVP_DecodeBlock counts the bytes that '=' padding stands for in its result; they are dropped.
std::optional<std::string> base64_decode(std::string_view in) {
  if (in.size() % 4 != 0) return std::nullopt;
  std::string out(in.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()),
                                static_cast<int>(in.size()));
  if (n < 0) return std::nullopt;
  std::size_t pad = 0;
  while (pad < 2 && pad < in.size() && in[in.size() - 1 - pad] == '=') ++pad;
  out.resize(static_cast<std::size_t>(n) - pad);
  return out;
}

// An int64 field as decimal text (see Note [etcd JSON gateway]); a left-out field is zero.
std::string int64_text(const json& j, const char* name) {
  const auto it = j.find(name);
  if (it == j.end()) return "0";
  if (it->is_number_integer()) return std::to_string(it->get<std::int64_t>());
  return it->get<std::string>();  // throws for anything else: the caller reports the answer
}

// "http://host:port": a scheme and etcd's client port 2379 when they are left out.
std::string normalize_endpoint(std::string e) {
  while (e.ends_with('/')) e.pop_back();
  if (e.find("://") == std::string::npos) e = "http://" + e;
  const std::size_t host = e.find("://") + 3;
  TY_CHECK(host < e.size(), "EtcdOptions.endpoint '", e, "' names no host.");
  const std::size_t colon = e.rfind(':');
  const std::size_t bracket = e.rfind(']');  // an IPv6 address: "[::1]:2379"
  if (colon < host || (bracket != std::string::npos && colon < bracket)) e += ":2379";
  return e;
}

class EtcdBackend final : public RendezvousBackend {
 public:
  explicit EtcdBackend(EtcdOptions options)
      : options_(std::move(options)),
        endpoint_(normalize_endpoint(options_.endpoint)),
        key_b64_(base64_encode(options_.key)) {}

  std::optional<std::pair<std::string, std::string>> get_state() override {
    const json answer = post("/v3/kv/range", {{"key", key_b64_}});
    return read_answer("/v3/kv/range", answer, [&] { return stored(answer); });
  }

  SetResult set_state(const std::string& state, const std::optional<std::string>& token) override {
    // The key's mod_revision is still the token, or (no token) the key was never created.
    json compare = {{"key", key_b64_}, {"result", "EQUAL"}};
    if (token) {
      compare["target"] = "MOD";
      compare["mod_revision"] = *token;
    } else {
      compare["target"] = "CREATE";
      compare["create_revision"] = "0";
    }
    const json put = {{"requestPut", {{"key", key_b64_}, {"value", base64_encode(state)}}}};
    const json range = {{"requestRange", {{"key", key_b64_}}}};
    const json answer = post("/v3/kv/txn", {{"compare", json::array({compare})},
                                            {"success", json::array({put})},
                                            {"failure", json::array({range})}});
    return read_answer("/v3/kv/txn", answer, [&] {
      if (answer.value("succeeded", false)) {
        return SetResult{
            .state = state, .token = int64_text(answer.at("header"), "revision"), .written = true};
      }
      // The failure branch read what is stored now.
      auto now = stored(answer.at("responses").at(0).at("response_range"));
      // The interface has no way to say "nothing stored" here, and writing anyway would undo
      // whatever deleted the key: tell the user.
      TY_CHECK_T(Error, now.has_value(), "The rendezvous state '", options_.key, "' in ",
                 describe(), " was deleted while this node was changing it. HINT: another ",
                 "program uses the same key; use another --rdzv-id.");
      return SetResult{.state = std::move(now->first), .token = std::move(now->second)};
    });
  }

  std::string describe() const override { return "etcd at " + endpoint_; }

 private:
  // The value and mod_revision of the key in a range answer, or nullopt when it has none.
  std::optional<std::pair<std::string, std::string>> stored(const json& range) const {
    const auto kvs = range.find("kvs");
    if (kvs == range.end() || kvs->empty()) return std::nullopt;
    const json& kv = kvs->at(0);
    auto value = base64_decode(kv.value("value", ""));
    TY_CHECK_T(CorruptDataError, value.has_value(), describe(), " returned a value for '",
               options_.key, "' that is not base64.");
    return std::make_pair(std::move(*value), int64_text(kv, "mod_revision"));
  }

  // Runs `read` over a parsed answer, turning a missing or mistyped field into an Error.
  template <typename F>
  std::invoke_result_t<F&> read_answer(const char* path, const json& answer, F&& read) const {
    try {
      return read();
    } catch (const json::exception& e) {
      throw Error(detail::concat(describe(), " answered POST ", path,
                                 " with JSON trainyard cannot read (", e.what(),
                                 "): ", net::excerpt(answer.dump())));
    }
  }

  // POSTs body to path and returns the parsed answer. Connection failures and timeouts, etcd's
  // "unavailable" (HTTP 503, 504: no leader, a leader change) and its gateway's 408 and 502 (its
  // gRPC connection closing or timing out: etcd shutting down answers 408 "grpc: the client
  // connection is closing" for a moment before it stops listening) are retried up to
  // max_attempts times (HttpClient::send). Retrying a txn is safe: if an attempt that seemed lost
  // was applied, the retry's compare fails and the caller sees its own write as the current state.
  json post(const char* path, const json& body) {
    const std::string url = endpoint_ + path;
    const net::HttpRequest request{.method = "POST",
                                   .url = url,
                                   .headers = {{"Content-Type", "application/json"}},
                                   .body = body.dump(),
                                   .connect_timeout = options_.timeout,
                                   .timeout = options_.timeout};
    const net::RetryPolicy policy{
        .max_attempts = options_.max_attempts,
        .backoff = kBackoff,
        .backoff_max = kMaxBackoff,
        .jitter = 0.0,
        .retry_if =
            [](const net::HttpResponse& r) {
              return r.status == 408 || r.status == 502 || r.status == 503 || r.status == 504;
            },
        .on_retry =
            [&](const net::RetryPolicy::Retry& r) {
              logger("etcd")->warn("POST {} attempt {}/{} failed: {} Retrying in {} ms.", url,
                                   r.failed_attempt, options_.max_attempts, r.what,
                                   r.pause.count());
            }};
    net::HttpResponse r;
    try {
      r = http_.send(request, policy);
    } catch (const net::HttpError& e) {
      throw NetworkError(detail::concat(
          "Could not reach ", describe(), " (POST ", path, "): ", e.log().attempts,
          " attempt(s) over ", e.log().elapsed.count(), " ms failed (each limited to ",
          options_.timeout.count(), " ms).", e.log().list(), " HINT: is etcd running at ",
          endpoint_, "? Check --rdzv-endpoint."));
    }
    if (r.status != 200) {
      throw Error(detail::concat(
          describe(), " refused POST ", path, ": ", r.describe(),
          r.status == 404 ? " HINT: is it etcd's client URL, and etcd >= 3.4? (Older versions "
                            "serve the JSON gateway at /v3beta/.)"
                          : ""));
    }
    try {
      return json::parse(r.body);
    } catch (const json::exception& e) {
      throw Error(detail::concat(describe(), " answered POST ", path,
                                 " with a body that is not JSON: ", net::excerpt(r.body)));
    }
  }

  const EtcdOptions options_;
  const std::string endpoint_;  // "http://host:port"
  const std::string key_b64_;
  net::HttpClient http_;  // thread-safe
};

}  // namespace

std::unique_ptr<RendezvousBackend> make_etcd_backend(EtcdOptions options) {
  TY_CHECK(!options.endpoint.empty(),
           "EtcdOptions.endpoint is empty. HINT: pass --rdzv-endpoint host:port.");
  TY_CHECK(!options.key.empty(), "EtcdOptions.key is empty.");
  TY_CHECK(options.timeout.count() > 0, "EtcdOptions.timeout must be > 0 ms, got ",
           options.timeout.count(), ".");
  TY_CHECK(options.max_attempts >= 1, "EtcdOptions.max_attempts must be >= 1, got ",
           options.max_attempts, ".");
  return std::make_unique<EtcdBackend>(std::move(options));
}

}  // namespace trainyard::elastic
