// HttpClient over libcurl's easy interface; see http_client.h.
#include "trainyard/net/http_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <random>
#include <thread>

#include "trainyard/log.h"

namespace trainyard::net {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr std::uint64_t kMaxReserveBytes = 5ull << 30;  // S3's largest PUT, and so GET
constexpr std::chrono::seconds kRetryWarnEvery{5};      // the default on_retry's warnings

bool iequals(std::string_view a, std::string_view b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    return std::tolower(static_cast<unsigned char>(x)) ==
           std::tolower(static_cast<unsigned char>(y));
  });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())) != 0) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())) != 0) s.remove_suffix(1);
  return s;
}

std::string sentence(std::string s) {
  return s.ends_with('.') ? s : s + ".";
}

double seconds(milliseconds d) {
  return std::chrono::duration<double>(d).count();
}

TransportError classify(CURLcode code) {
  switch (code) {
    case CURLE_OK:
      return TransportError::kNone;
    case CURLE_COULDNT_CONNECT:
      return TransportError::kConnect;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
      return TransportError::kResolve;
    case CURLE_OPERATION_TIMEDOUT:
      return TransportError::kTimeout;
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
      return TransportError::kTlsVerify;
    default:
      return TransportError::kOther;
  }
}

// Failures that another attempt cannot fix.
bool permanent(CURLcode code) {
  switch (code) {
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_URL_MALFORMAT:
    case CURLE_OUT_OF_MEMORY:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_LOGIN_DENIED:
      return true;
    default:
      return false;
  }
}

struct CurlDeleter {
  void operator()(CURL* h) const { curl_easy_cleanup(h); }
};
using CurlHandle = std::unique_ptr<CURL, CurlDeleter>;

struct SlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};

// One attempt, shared with curl's callbacks (which run on the calling thread).
struct Transfer {
  const HttpRequest* request = nullptr;
  HttpResponse response;
  long head_status = 0;    // of the last status line seen
  std::uint64_t sunk = 0;  // bytes given to request->body_sink
  HttpProgress progress;
  std::exception_ptr error;  // thrown by a callback; rethrown once curl returns
  CURLcode code = CURLE_OK;
  std::string curl_error;

  std::string describe_transport() const {
    return sentence(detail::concat("curl error ", static_cast<int>(code), " (",
                                   curl_easy_strerror(code), "): ", curl_error));
  }
};

std::size_t on_body(char* data, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::size_t len = size * n;
  if (!t->request->body_sink || t->head_status < 200 || t->head_status >= 300) {
    t->response.body.append(data, len);
    return len;
  }
  try {
    t->request->body_sink(t->sunk, std::string_view(data, len));
    t->sunk += len;
    return len;
  } catch (...) {
    t->error = std::current_exception();
    return 0;  // a short count aborts the transfer
  }
}

std::size_t on_header(char* data, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::size_t len = size * n;
  const std::string_view line(data, len);
  if (line.starts_with("HTTP/")) {  // a new answer (after "100 Continue"): its own headers
    t->response.headers.clear();
    const std::size_t space = line.find(' ');
    t->head_status = space == std::string_view::npos
                         ? 0
                         : std::strtol(std::string(line.substr(space + 1, 3)).c_str(), nullptr, 10);
    return len;
  }
  const std::size_t colon = line.find(':');
  if (colon == std::string_view::npos) return len;
  const std::string_view name = trim(line.substr(0, colon));
  const std::string_view value = trim(line.substr(colon + 1));
  t->response.headers.emplace_back(name, value);
  if (iequals(name, "content-length") && t->request->method != "HEAD" &&
      !(t->request->body_sink && t->head_status >= 200 && t->head_status < 300)) {
    // Reserve up front so a large body is not copied while the buffer grows.
    const unsigned long long bytes = std::strtoull(std::string(value).c_str(), nullptr, 10);
    if (bytes <= kMaxReserveBytes) t->response.body.reserve(bytes);
  }
  return len;
}

int on_xferinfo(void* user, curl_off_t, curl_off_t received, curl_off_t, curl_off_t sent) {
  auto* t = static_cast<Transfer*>(user);
  t->progress.bytes_moved = static_cast<std::uint64_t>(received + sent);
  try {
    t->request->on_progress(t->progress);
    return 0;
  } catch (...) {
    t->error = std::current_exception();
    return 1;  // aborts the transfer
  }
}

bool has_header(const Headers& headers, std::string_view name) {
  return std::any_of(headers.begin(), headers.end(),
                     [&](const auto& h) { return iequals(h.first, name); });
}

std::string method_url(const HttpRequest& r) {
  return r.method + " " + r.url;
}

}  // namespace

std::optional<std::string> HttpResponse::header(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (iequals(n, name)) return v;
  }
  return std::nullopt;
}

std::string HttpResponse::describe() const {
  const std::string_view text = trim(body);
  if (text.empty()) return detail::concat("HTTP ", status, " with an empty body.");
  return sentence(detail::concat("HTTP ", status, ": ", excerpt(text)));
}

std::string excerpt(std::string_view body) {
  return body.size() <= kExcerptChars ? std::string(body)
                                      : std::string(body.substr(0, kExcerptChars)) + "...";
}

void AttemptLog::add(int attempt, std::string what) {
  if (!entries.empty() && entries.back().what == what) {
    entries.back().last_attempt = attempt;
  } else {
    entries.push_back({attempt, attempt, std::move(what)});
  }
}

std::string AttemptLog::list() const {
  std::string out;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (entries.size() > 8 && i == 4) {
      out += detail::concat(" (", entries.size() - 8, " more kinds of failure)");
      i = entries.size() - 4;
    }
    const Entry& e = entries[i];
    out += e.first_attempt == e.last_attempt
               ? detail::concat(" Attempt ", e.first_attempt, ": ", e.what)
               : detail::concat(" Attempts ", e.first_attempt, "-", e.last_attempt, ": ", e.what);
  }
  return out;
}

HttpError::HttpError(std::string message,
                     AttemptLog log,
                     TransportError transport,
                     bool retryable,
                     std::optional<HttpResponse> last_response)
    : NetworkError(std::move(message)),
      log_(std::move(log)),
      transport_(transport),
      retryable_(retryable),
      last_response_(std::move(last_response)) {}

milliseconds retry_pause(const RetryPolicy& policy, int failed_attempts, double unit_random) {
  const double doubled =
      static_cast<double>(policy.backoff.count()) * std::exp2(std::min(failed_attempts - 1, 62));
  const double capped = std::min(doubled, static_cast<double>(policy.backoff_max.count()));
  return milliseconds(std::llround(capped * (1.0 - policy.jitter * unit_random)));
}

struct HttpClient::Impl {
  std::mutex mu;
  std::vector<CurlHandle> idle;  // handles whose last request succeeded; mu

  CurlHandle acquire() {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!idle.empty()) {
        CurlHandle h = std::move(idle.back());
        idle.pop_back();
        return h;
      }
    }
    CurlHandle h(curl_easy_init());
    TY_CHECK_T(Error, h != nullptr, "curl_easy_init failed (out of memory?).");
    return h;
  }

  void release(CurlHandle h) {
    std::lock_guard<std::mutex> lock(mu);
    idle.push_back(std::move(h));
  }

  // One attempt. Rethrows what a callback threw; a transport failure is in the result's code.
  Transfer attempt(const HttpRequest& req, const HttpProgress& progress) {
    Transfer t;
    t.request = &req;
    t.progress = progress;
    CurlHandle h = acquire();
    char errbuf[CURL_ERROR_SIZE] = {0};

    const std::string_view body = req.body_ref.value_or(std::string_view(req.body));
    const bool sends_body =
        req.method == "POST" || req.method == "PUT" || req.method == "PATCH" || !body.empty();
    std::unique_ptr<curl_slist, SlistDeleter> list;
    auto add = [&](const std::string& line) {
      curl_slist* l = curl_slist_append(list.get(), line.c_str());
      TY_CHECK_T(Error, l != nullptr, "curl_slist_append failed (out of memory?).");
      list.release();
      list.reset(l);
    };
    for (const auto& [name, value] : req.headers) {
      TY_CHECK(name.find_first_of(":\r\n") == std::string::npos &&
                   value.find_first_of("\r\n") == std::string::npos,
               "HttpRequest header '", name, "' for ", method_url(req),
               " contains ':' in its name or a line break.");
      add(value.empty() ? name + ":" : name + ": " + value);
    }
    if (sends_body && !has_header(req.headers, "Content-Type")) {
      add("Content-Type: application/octet-stream");
    }
    // Never wait for "100 Continue" (curl asks for it above 1 MiB); a signed request cannot
    // carry the empty header that says so (see AwsSigV4).
    if (!req.aws_sigv4 && !has_header(req.headers, "Expect")) add("Expect:");

    CURL* c = h.get();
    curl_easy_reset(c);  // keeps the connection cache
    curl_easy_setopt(c, CURLOPT_URL, req.url.c_str());
    curl_easy_setopt(c, CURLOPT_PATH_AS_IS, 1L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(c, CURLOPT_DNS_CACHE_TIMEOUT, 0L);  // resolve again for each connection
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(req.connect_timeout.count()));
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(req.timeout.count()));
    if (req.stall_timeout.count() > 0) {
      curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);  // bytes/s
      curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, static_cast<long>(req.stall_timeout.count()));
    }
    if (req.on_progress) {
      curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
      curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_xferinfo);
      curl_easy_setopt(c, CURLOPT_XFERINFODATA, &t);
    }
    if (req.aws_sigv4) {
      curl_easy_setopt(c, CURLOPT_AWS_SIGV4, req.aws_sigv4->provider.c_str());
      curl_easy_setopt(c, CURLOPT_USERNAME, req.aws_sigv4->access_key_id.c_str());
      curl_easy_setopt(c, CURLOPT_PASSWORD, req.aws_sigv4->secret_access_key.c_str());
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, list.get());
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
    if (sends_body) {
      // From memory, the way curl sends a POST (not as an upload, which would ask for
      // "100 Continue" even for a tiny body); other methods are named below.
      curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.empty() ? "" : body.data());
      curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    }
    if (!req.range.empty()) curl_easy_setopt(c, CURLOPT_RANGE, req.range.c_str());
    if (req.method == "HEAD") {
      curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    } else if (req.method != (sends_body ? "POST" : "GET")) {
      curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, req.method.c_str());
    }
    t.code = curl_easy_perform(c);
    if (t.code == CURLE_OK) {
      curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &t.response.status);
      release(std::move(h));
    } else {
      // Dropped with its connection: the next attempt connects (and resolves) afresh.
      t.curl_error = errbuf[0] != '\0' ? errbuf : curl_easy_strerror(t.code);
    }
    if (t.error) std::rethrow_exception(t.error);
    return t;
  }
};

HttpClient::HttpClient() : impl_(std::make_unique<Impl>()) {
  static std::once_flag curl_init;
  std::call_once(curl_init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

HttpClient::~HttpClient() = default;

HttpResponse HttpClient::perform(const HttpRequest& request) {
  const auto start = Clock::now();
  Transfer t = impl_->attempt(request, {.first_start = start, .attempt_start = start});
  if (t.code == CURLE_OK) return std::move(t.response);
  AttemptLog log;
  const std::string what = t.describe_transport();
  log.add(1, what);
  log.attempts = 1;
  log.elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  throw HttpError(detail::concat(method_url(request), " failed: ", what), std::move(log),
                  classify(t.code), !permanent(t.code), std::nullopt);
}

// Note [One retry loop]
// Every HTTP caller retries through send(): exponential backoff with jitter, bounded by attempts
// and a deadline measured from the first attempt, each failure recorded for the final error
// (c10d's recordError). Callers say which answers to retry (retry_if) and how to word a failure
// (describe), and may reword the final HttpError from its parts (S3 and etcd do, naming their
// options and a hint).
HttpResponse HttpClient::send(const HttpRequest& request, const RetryPolicy& policy) {
  const RetryPolicy& p = policy;
  TY_CHECK(p.max_attempts >= 0, "RetryPolicy.max_attempts = ", p.max_attempts,
           " must be >= 0 (0: no cap, the deadline bounds).");
  TY_CHECK(p.deadline.count() >= 0, "RetryPolicy.deadline = ", p.deadline.count(),
           " ms must be >= 0 (0: none).");
  TY_CHECK(p.max_attempts > 0 || p.deadline.count() > 0, "RetryPolicy for ", method_url(request),
           " has neither max_attempts nor a deadline: it would retry forever.");
  TY_CHECK(p.backoff.count() >= 0 && p.backoff_max >= p.backoff,
           "RetryPolicy.backoff = ", p.backoff.count(),
           " ms and backoff_max = ", p.backoff_max.count(),
           " ms must satisfy 0 <= backoff <= backoff_max.");
  TY_CHECK(p.jitter >= 0.0 && p.jitter <= 1.0, "RetryPolicy.jitter = ", p.jitter,
           " is outside [0, 1].");

  const auto first = Clock::now();
  std::minstd_rand rng(std::random_device{}());
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  AttemptLog log;
  auto last_warning = first - kRetryWarnEvery;
  for (int attempt = 1;; ++attempt) {
    const auto attempt_start = Clock::now();
    Transfer t = impl_->attempt(
        request, {.attempt = attempt, .first_start = first, .attempt_start = attempt_start});
    const auto now = Clock::now();
    log.attempts = attempt;
    logger("http")->debug("{} -> {} in {:.3f} s (attempt {})", method_url(request),
                          t.code == CURLE_OK ? std::to_string(t.response.status) : t.curl_error,
                          std::chrono::duration<double>(now - attempt_start).count(), attempt);
    std::string what;
    bool retryable = true;
    if (t.code == CURLE_OK) {
      const long s = t.response.status;
      const bool retry = p.retry_if ? p.retry_if(t.response) : (s >= 500 || s == 429);
      if (!retry) {
        t.response.attempt = attempt;
        return std::move(t.response);
      }
      what = p.describe ? p.describe(t.response) : t.response.describe();
    } else {
      what = t.describe_transport();
      retryable = !permanent(t.code);
    }
    log.add(attempt, what);
    log.elapsed = std::chrono::duration_cast<milliseconds>(now - first);
    const milliseconds pause = retry_pause(p, attempt, unit(rng));
    const bool capped = p.max_attempts > 0 && attempt >= p.max_attempts;
    const bool late = p.deadline.count() > 0 && now + pause - first > p.deadline;
    if (!retryable || capped || late) {
      std::string message =
          !retryable && attempt == 1
              ? detail::concat(method_url(request), " failed: ", what)
              : detail::concat(
                    method_url(request), " failed ",
                    retryable ? "after " : "with a failure that retrying cannot fix at attempt ",
                    attempt, retryable ? " attempt(s)" : "", " over ",
                    fmt::format("{:.1f}", seconds(log.elapsed)),
                    " s (RetryPolicy.max_attempts = ", p.max_attempts,
                    ", deadline = ", p.deadline.count(), " ms).", log.list());
      std::optional<HttpResponse> last;
      if (t.code == CURLE_OK) last = std::move(t.response);
      throw HttpError(std::move(message), std::move(log), classify(t.code), retryable,
                      std::move(last));
    }
    if (p.on_retry) {
      p.on_retry({.failed_attempt = attempt, .what = what, .pause = pause, .elapsed = log.elapsed});
    } else if (now - last_warning >= kRetryWarnEvery) {
      last_warning = now;
      logger("http")->warn(
          "{} failed at attempt {} ({:.1f} s since the first): {} Retrying in {} ms.",
          method_url(request), attempt, seconds(log.elapsed), what, pause.count());
    }
    // In slices, reporting progress between them (heartbeats): pauses reach backoff_max.
    const auto resume = now + pause;
    for (auto left = pause; left.count() > 0; left -= std::chrono::seconds(1)) {
      if (request.on_progress) {
        request.on_progress({.attempt = attempt + 1,
                             .between_attempts = true,
                             .first_start = first,
                             .attempt_start = resume});
      }
      std::this_thread::sleep_for(std::min<milliseconds>(left, std::chrono::seconds(1)));
    }
  }
}

}  // namespace trainyard::net
