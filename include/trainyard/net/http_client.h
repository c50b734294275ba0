// HttpClient: trainyard's one HTTP client (libcurl underneath, kept out of this header), used by
// S3 storage, the etcd rendezvous backend and the cluster's clients. perform() makes one attempt;
// send() retries transport failures and chosen statuses with exponential backoff and jitter until
// a RetryPolicy's max_attempts or deadline, and its final error lists every failed attempt.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "trainyard/error.h"

namespace trainyard::net {

using Headers = std::vector<std::pair<std::string, std::string>>;

// Where an attempt is, for HttpRequest::on_progress (see there).
struct HttpProgress {
  int attempt = 1;                // 1 for the first
  bool between_attempts = false;  // send() is backing off before attempt `attempt`
  std::uint64_t bytes_moved = 0;  // sent + received by this attempt so far
  std::chrono::steady_clock::time_point first_start;    // the first attempt began
  std::chrono::steady_clock::time_point attempt_start;  // this attempt began (or will)
};

// AWS Signature Version 4, computed by libcurl (CURLOPT_AWS_SIGV4). curl signs every header in
// HttpRequest::headers, so a signed request carries no header the client would add on its own
// (it sends no "Expect:"); see Note [SigV4 with curl] in src/storage/s3_storage.cpp.
struct AwsSigV4 {
  std::string provider;  // "aws:amz:<region>:<service>", e.g. "aws:amz:us-east-1:s3"
  std::string access_key_id;
  std::string secret_access_key;
};

struct HttpRequest {
  std::string method = "GET";  // GET, HEAD, POST, PUT, PATCH, DELETE, ...
  // Sent as given: percent-encode it yourself; "a/../b" is not squashed (CURLOPT_PATH_AS_IS).
  std::string url;
  // "Name: value" lines after curl's own. An empty value removes a header curl would add.
  // Without a Content-Type a request with a body says application/octet-stream.
  Headers headers;
  std::string body;  // sent with POST, PUT and PATCH, and with any method when not empty
  // A body the caller owns, sent instead of `body` when set (a large upload, not copied). It must
  // outlive the call.
  std::optional<std::string_view> body_ref;
  std::string range;  // "first-last" bytes for a Range header (a GET); "" for everything
  std::chrono::milliseconds connect_timeout{5'000};  // per attempt
  std::chrono::milliseconds timeout{30'000};         // one attempt in all; 0: no limit
  // An attempt that moves less than 1 byte/s for this long is abandoned as timed out, however
  // long `timeout` is (a frozen server costs seconds, not the whole timeout). curl averages the
  // speed over the last few seconds, so a transfer that stops after some bytes ends a few
  // seconds later than one that never moves any. 0: no such limit.
  std::chrono::seconds stall_timeout{0};
  std::optional<AwsSigV4> aws_sigv4;
  // Receives the body of a 2xx answer instead of HttpResponse::body, in order, at byte `offset`
  // of that attempt's body; offset 0 again means send() is retrying and the body starts over.
  // Answers of other statuses still go to HttpResponse::body (their error text).
  std::function<void(std::uint64_t offset, std::string_view data)> body_sink;
  // Called on the calling thread while an attempt runs (curl's progress meter: often, and at
  // least about once a second) and once a second while send() backs off between attempts: for
  // heartbeats and "still waiting" warnings. What it throws ends the call.
  std::function<void(const HttpProgress&)> on_progress;
};

struct HttpResponse {
  long status = 0;  // the HTTP status
  std::string body;
  Headers headers;  // as received, of the final answer
  int attempt = 1;  // the attempt of send() that got this answer; 1 for perform()

  // The first header of that name, compared without case.
  std::optional<std::string> header(std::string_view name) const;
  // A sentence for messages: "HTTP 503: <the first 300 bytes of the body>."
  std::string describe() const;
};

// Why an attempt got no HTTP answer.
enum class TransportError {
  kNone,       // it got one
  kConnect,    // the connection was refused or could not be made
  kResolve,    // the host name did not resolve
  kTimeout,    // connect_timeout, timeout or stall_timeout ran out
  kTlsVerify,  // the server's certificate could not be verified
  kOther,      // anything else (the connection broke, a malformed URL, ...)
};

// Failed attempts as a request's final error lists them.
struct AttemptLog {
  struct Entry {
    int first_attempt = 0;
    int last_attempt = 0;
    std::string what;  // a sentence: "curl error 7 (Couldn't connect to server): ..."
  };
  std::vector<Entry> entries;            // consecutive identical failures share one entry
  int attempts = 0;                      // attempts made, the successful one (if any) included
  std::chrono::milliseconds elapsed{0};  // from the first attempt's start to the end

  void add(int attempt, std::string what);
  // " Attempt 1: <what> Attempts 2-4: <what>", naming the first and last four entries when there
  // are more than eight kinds of failure.
  std::string list() const;
};

// At most the first kExcerptChars characters of an answer's body (then "..."), for messages.
inline constexpr std::size_t kExcerptChars = 300;
std::string excerpt(std::string_view body);

// A request that got no usable answer: perform()'s transport failure, or send() gave up. The
// message names the method, the URL, the attempts and the time; the parts are here for callers
// that word their own message (S3, etcd).
class HttpError : public NetworkError {
 public:
  HttpError(std::string message,
            AttemptLog log,
            TransportError transport,
            bool retryable,
            std::optional<HttpResponse> last_response);

  const AttemptLog& log() const { return log_; }
  // The last attempt's failure: a transport error, or (kNone) the answer in last_response().
  TransportError transport() const { return transport_; }
  // Whether that failure was of a kind worth retrying: false when a permanent one (a malformed
  // URL, a certificate that fails verification) ended send() before its limits did.
  bool retryable() const { return retryable_; }
  const std::optional<HttpResponse>& last_response() const { return last_response_; }

 private:
  AttemptLog log_;
  TransportError transport_;
  bool retryable_;
  std::optional<HttpResponse> last_response_;
};

// When send() tries again. Retries end at max_attempts or when the next attempt would start
// after `deadline` from the first (an attempt under way is not cut short, so a call lasts at most
// about deadline + one attempt's timeout), whichever comes first; one of them must be set.
// Retrying a request that may have been applied (a POST whose answer was lost) is the caller's
// choice: set max_attempts = 1 where it is not safe.
struct RetryPolicy {
  int max_attempts = 3;                    // the first included; 0: no cap (deadline bounds)
  std::chrono::milliseconds deadline{0};   // 0: none (max_attempts bounds)
  std::chrono::milliseconds backoff{100};  // the first pause; doubled after each failure
  std::chrono::milliseconds backoff_max{2'000};
  // Each pause is shortened by a random fraction of up to `jitter` (uniform in [d * (1 - jitter),
  // d]), so that many clients failing together do not retry in step. In [0, 1].
  double jitter = 0.2;
  // Whether an HTTP answer is worth another attempt; empty: 5xx and 429. Transport failures are
  // retried except the permanent ones (a malformed URL, an unverifiable certificate).
  std::function<bool(const HttpResponse&)> retry_if;
  // A failed attempt's sentence in the final error; empty: HttpResponse::describe().
  std::function<std::string(const HttpResponse&)> describe;
  struct Retry {
    int failed_attempt = 0;
    std::string_view what;  // the failure, as `describe` says it
    std::chrono::milliseconds pause;
    std::chrono::milliseconds elapsed;  // since the first attempt began
  };
  // Called before each pause; empty: a warning in the "http" log, at most every 5 s.
  std::function<void(const Retry&)> on_retry;
};

// The pause after `failed_attempts` (>= 1) failures: backoff * 2^(failed_attempts - 1), capped at
// backoff_max, less jitter * unit_random of it; unit_random is in [0, 1).
std::chrono::milliseconds retry_pause(const RetryPolicy& policy,
                                      int failed_attempts,
                                      double unit_random);

// Thread-safe: each call runs on a curl handle of its own, taken from a pool of idle ones that
// keep their connections alive for the next request (a handle whose attempt failed is dropped).
// Host names are resolved again for every new connection (no DNS cache), so a server that comes
// back at a new address behind the same name is found on the next attempt. Redirects are not
// followed.
class HttpClient {
 public:
  HttpClient();
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // One attempt; blocks until the answer or a timeout. Any HTTP status is an answer. Throws
  // HttpError (a NetworkError) naming the method, the URL and curl's message when none came.
  HttpResponse perform(const HttpRequest& request);

  // perform() with retries per `policy`. Returns the first answer that policy.retry_if does not
  // retry (which may be an HTTP error for the caller); throws HttpError listing every failed
  // attempt when the limits are reached or a failure is permanent, and InvalidArgumentError for
  // a policy without limits.
  HttpResponse send(const HttpRequest& request, const RetryPolicy& policy = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainyard::net
