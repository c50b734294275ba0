// The etcd rendezvous backend over etcd's JSON gateway; see etcd_backend.h.
#include "trainyard/elastic/etcd_backend.h"

#include <curl/curl.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>

#include "trainyard/error.h"
#include "trainyard/log.h"

namespace trainyard::elastic {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr std::size_t kExcerptChars = 300;  // of an answer's body, quoted in errors
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

std::string excerpt(const std::string& body) {
  return body.size() <= kExcerptChars ? body : body.substr(0, kExcerptChars) + "...";
}

struct CurlDeleter {
  void operator()(CURL* h) const { curl_easy_cleanup(h); }
};

struct Reply {
  CURLcode code = CURLE_OK;
  std::string curl_error;
  long status = 0;
  std::string body;

  // A sentence: "curl error 7 (Couldn't connect to server): Failed to connect to ...".
  std::string describe() const {
    const std::string s = code != CURLE_OK
                              ? detail::concat("curl error ", static_cast<int>(code), " (",
                                               curl_easy_strerror(code), "): ", curl_error)
                              : detail::concat("HTTP ", status, ": ", excerpt(body));
    return s.ends_with('.') ? s : s + ".";
  }
};

std::size_t on_body(char* data, std::size_t size, std::size_t n, void* reply) {
  static_cast<Reply*>(reply)->body.append(data, size * n);
  return size * n;
}

class EtcdBackend final : public RendezvousBackend {
 public:
  explicit EtcdBackend(EtcdOptions options)
      : options_(std::move(options)),
        endpoint_(normalize_endpoint(options_.endpoint)),
        key_b64_(base64_encode(options_.key)),
        curl_(curl_easy_init()) {
    TY_CHECK_T(Error, curl_ != nullptr, "curl_easy_init failed for etcd at ", endpoint_, ".");
  }

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
                                 "): ", excerpt(answer.dump())));
    }
  }

  // POSTs body to path and returns the parsed answer. Connection failures and timeouts, etcd's
  // "unavailable" (HTTP 503, 504: no leader, a leader change) and its gateway's 408 and 502 (its
  // gRPC connection closing or timing out: etcd shutting down answers 408 "grpc: the client
  // connection is closing" for a moment before it stops listening) are retried up to
  // max_attempts times. Retrying a txn is safe: if an attempt that seemed lost was applied, the
  // retry's compare fails and the caller sees its own write as the current state.
  json post(const char* path, const json& body) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string url = endpoint_ + path;
    const std::string payload = body.dump();
    std::string failures;
    const auto first_start = std::chrono::steady_clock::now();
    for (int attempt = 1;; ++attempt) {
      const auto start = std::chrono::steady_clock::now();
      const Reply r = perform(url, payload);
      const auto ms =
          std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - start);
      logger("etcd")->debug("POST {} -> {} in {} ms (attempt {})", url,
                            r.code == CURLE_OK ? std::to_string(r.status) : r.curl_error,
                            ms.count(), attempt);
      if (r.code == CURLE_OK && r.status == 200) {
        try {
          return json::parse(r.body);
        } catch (const json::exception& e) {
          throw Error(detail::concat(describe(), " answered POST ", path,
                                     " with a body that is not JSON: ", excerpt(r.body)));
        }
      }
      const bool transient =
          r.status == 408 || r.status == 502 || r.status == 503 || r.status == 504;
      if (r.code == CURLE_OK && !transient) {
        throw Error(detail::concat(
            describe(), " refused POST ", path, ": ", r.describe(),
            r.status == 404 ? " HINT: is it etcd's client URL, and etcd >= 3.4? (Older versions "
                              "serve the JSON gateway at /v3beta/.)"
                            : ""));
      }
      failures += detail::concat(" Attempt ", attempt, ": ", r.describe());
      if (attempt >= options_.max_attempts) {
        const auto spent = std::chrono::duration_cast<milliseconds>(
            std::chrono::steady_clock::now() - first_start);
        throw NetworkError(detail::concat(
            "Could not reach ", describe(), " (POST ", path, "): ", attempt, " attempt(s) over ",
            spent.count(), " ms failed (each limited to ", options_.timeout.count(), " ms).",
            failures, " HINT: is etcd running at ", endpoint_, "? Check --rdzv-endpoint."));
      }
      const auto backoff =
          std::min(milliseconds(50) * (1 << std::min(attempt - 1, 5)), kMaxBackoff);
      logger("etcd")->warn("POST {} attempt {}/{} failed: {} Retrying in {} ms.", url, attempt,
                           options_.max_attempts, r.describe(), backoff.count());
      std::this_thread::sleep_for(backoff);
    }
  }

  // One request on the kept handle (which keeps its connection between requests). mu_ held.
  Reply perform(const std::string& url, const std::string& payload) {
    Reply r;
    char errbuf[CURL_ERROR_SIZE] = {0};
    curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
    headers = curl_slist_append(headers, "Expect:");  // never wait for "100 Continue"
    CURL* h = curl_.get();
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url.c_str());
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.timeout.count()));
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(options_.timeout.count()));
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, payload.c_str());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(payload.size()));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &r);
    r.code = curl_easy_perform(h);
    if (r.code != CURLE_OK) {
      r.curl_error = errbuf[0] != '\0' ? errbuf : curl_easy_strerror(r.code);
    } else {
      curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.status);
    }
    curl_slist_free_all(headers);
    return r;
  }

  const EtcdOptions options_;
  const std::string endpoint_;  // "http://host:port"
  const std::string key_b64_;
  std::mutex mu_;  // serialises requests on curl_
  std::unique_ptr<CURL, CurlDeleter> curl_;
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
  static std::once_flag curl_init;
  std::call_once(curl_init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  return std::make_unique<EtcdBackend>(std::move(options));
}

}  // namespace trainyard::elastic
