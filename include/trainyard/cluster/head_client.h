// A client of the trainyard head's REST API (the Ray-compatible Jobs API and the worker
// protocol), used by the worker daemon and the CLI's cluster commands. JSON in, JSON out; errors
// turned into sentences that say what to fix (a missing or wrong token, an unknown job).
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "trainyard/cluster/api.h"
#include "trainyard/error.h"

namespace trainyard::net {
class HttpClient;
}

namespace trainyard::cluster {

// The head's default port: Ray's dashboard/Jobs API port, so that `ray job submit --address
// http://head:8265` finds a trainyard head where it would find a Ray one.
inline constexpr int kDefaultHeadPort = 8265;
// Where client commands look for the head and the token when no flag gives them:
// kAddressEnv and kTokenEnv (env.h).

// The head answered 404: no such job (or node).
class NotFoundError : public Error {
 public:
  using Error::Error;
};

// The head answered 409 (a submission_id that is taken) at the call's `attempt`: above 1, an
// earlier attempt whose answer was lost may have been the one that took it.
class ConflictError : public InvalidArgumentError {
 public:
  ConflictError(std::string message, int attempt)
      : InvalidArgumentError(std::move(message)), attempt_(attempt) {}
  int attempt() const { return attempt_; }

 private:
  int attempt_;
};

struct HeadClientOptions {
  std::string address;               // "host:port" or "http://host:port"
  std::optional<std::string> token;  // sent as "Authorization: Bearer <token>"
  std::chrono::milliseconds connect_timeout{3'000};
  std::chrono::milliseconds timeout{15'000};  // per request
  // Per call, when the head cannot be reached or answers 5xx. Calls that change state are sent
  // once unless `idempotent` is passed (the worker protocol's calls are idempotent).
  int max_attempts = 3;
  // When above 0, calls ride out a head that cannot be reached or answers 5xx (one restarting)
  // for this long instead of max_attempts: they retry with back-off, warn in the "client" log at
  // most every 5 s how long they have been trying and for how long they will, and say when the
  // head answers again (Note [Clients ride out a head restart]).
  std::chrono::milliseconds ride_out{0};
};

class HeadClient {
 public:
  explicit HeadClient(HeadClientOptions options);
  ~HeadClient();
  HeadClient(const HeadClient&) = delete;
  HeadClient& operator=(const HeadClient&) = delete;

  // path starts with '/'; the answer's body as JSON (null for an empty body). Throws
  // NetworkError when the head cannot be reached (every attempt named), Error for 401/403 with a
  // hint about the token, NotFoundError for 404, InvalidArgumentError for 400 and ConflictError
  // for 409 carrying the head's message, Error otherwise. Thread-safe.
  nlohmann::json get(std::string_view path);
  nlohmann::json post(std::string_view path, const nlohmann::json& body, bool idempotent = false);
  nlohmann::json del(std::string_view path);

  const std::string& base_url() const { return base_; }

 private:
  nlohmann::json call(const char* method,
                      std::string_view path,
                      const nlohmann::json* body,
                      bool idempotent);

  HeadClientOptions options_;
  std::string base_;
  std::unique_ptr<net::HttpClient> http_;
};

// The head's address from --address (when given) or TRAINYARD_ADDRESS, else the local default
// http://127.0.0.1:8265.
std::string resolve_address(const std::string& flag);

// The token from --token-file (when given; refused if others can read it) or TRAINYARD_TOKEN,
// else the generated token of a head on this host in its default state directory
// (~/.trainyard/head/token) when there is one, else none.
std::optional<std::string> resolve_token(const std::string& token_file_flag);

}  // namespace trainyard::cluster
