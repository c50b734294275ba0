// S3Storage: checkpoint storage on Amazon S3 or an S3-compatible service. libcurl signs every
// request (CURLOPT_AWS_SIGV4); the few XML answers S3 gives (ListObjectsV2, multipart upload,
// errors) are read by a small parser below. See s3_storage.h for the behaviour.
#include "trainyard/storage/s3_storage.h"

#include <curl/curl.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "trainyard/error.h"
#include "trainyard/heartbeat.h"
#include "trainyard/log.h"
#include "trainyard/seconds.h"

namespace trainyard::storage {
namespace {

constexpr std::size_t kMinPartSize = 5u << 20;     // S3's minimum for every part but the last
constexpr std::size_t kMaxObjectPut = 5ull << 30;  // S3's limit for one PUT, and for one part
constexpr std::size_t kMaxParts = 10'000;          // S3's limit on parts per upload
constexpr std::chrono::milliseconds kMaxBackoff{10'000};

std::string sha256_hex(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  TY_ASSERT(EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr) == 1);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out += kHex[md[i] >> 4];
    out += kHex[md[i] & 15];
  }
  return out;
}

// Percent-encoding as SigV4 canonicalises it: RFC 3986 unreserved characters stay, every other
// byte becomes %XX (upper-case hex). With keep_slash, '/' stays as well (object key paths).
std::string uri_encode(std::string_view s, bool keep_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    const bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                            (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' || c == '~';
    if (unreserved || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string xml_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Decodes the five predefined entities and character references (&#13; &#x1F;); S3 writes
// control characters in keys as the latter. Anything unrecognised is kept as it is.
std::string xml_unescape(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const std::size_t semi = s[i] == '&' ? s.find(';', i) : std::string_view::npos;
    if (semi == std::string_view::npos || semi - i > 10) {
      out += s[i];
      continue;
    }
    const std::string_view name = s.substr(i + 1, semi - i - 1);
    if (name == "amp") {
      out += '&';
    } else if (name == "lt") {
      out += '<';
    } else if (name == "gt") {
      out += '>';
    } else if (name == "quot") {
      out += '"';
    } else if (name == "apos") {
      out += '\'';
    } else if (name.size() > 1 && name[0] == '#') {
      const bool hex = name[1] == 'x' || name[1] == 'X';
      const std::string digits(name.substr(hex ? 2 : 1));
      char* end = nullptr;
      const unsigned long cp = std::strtoul(digits.c_str(), &end, hex ? 16 : 10);
      if (digits.empty() || *end != '\0' || cp > 0x10FFFF) {
        out += s[i];
        continue;
      }
      append_utf8(out, static_cast<std::uint32_t>(cp));
    } else {
      out += s[i];
      continue;
    }
    i = semi;
  }
  return out;
}

// The raw content of each <name ...>...</name> element in xml, in order; <name/> gives "".
// Enough for S3's answers, which have no CDATA, comments or nested elements of one name.
std::vector<std::string_view> xml_elements(std::string_view xml, std::string_view name) {
  std::vector<std::string_view> out;
  const std::string open = "<" + std::string(name);
  const std::string close = "</" + std::string(name) + ">";
  std::size_t pos = 0;
  while ((pos = xml.find(open, pos)) != std::string_view::npos) {
    pos += open.size();
    // "<Key" must not match "<KeyCount>".
    if (pos >= xml.size() || std::strchr("> \t\r\n/", xml[pos]) == nullptr) continue;
    const std::size_t gt = xml.find('>', pos);
    if (gt == std::string_view::npos) break;
    if (xml[gt - 1] == '/') {
      out.emplace_back();
      pos = gt + 1;
      continue;
    }
    const std::size_t end = xml.find(close, gt + 1);
    if (end == std::string_view::npos) break;
    out.push_back(xml.substr(gt + 1, end - gt - 1));
    pos = end + close.size();
  }
  return out;
}

// The decoded text of the first <name> element, or "" when there is none.
std::string xml_text(std::string_view xml, std::string_view name) {
  auto found = xml_elements(xml, name);
  return found.empty() ? std::string() : xml_unescape(found.front());
}

std::string env_or(const EnvLookup& env, const char* name, const char* fallback = nullptr) {
  auto v = env(name);
  if (v.has_value() && !v->empty()) return *v;
  if (fallback != nullptr) {
    if (auto f = env(fallback); f.has_value()) return *f;
  }
  return "";
}

struct Request {
  const char* method = "GET";  // GET, PUT, POST or DELETE
  std::string key;             // the object key inside the bucket; "" for the bucket itself
  std::string query;           // sorted and encoded, as SigV4 wants: "a=1&b=x%2Fy"
  std::string_view body;       // not owned; outlives the request
  const char* content_type = "application/octet-stream";  // sent with PUT and POST
  bool error_in_200 = false;  // S3 may answer 200 with an <Error> (CompleteMultipartUpload)
  std::string what;           // for messages: "PUT s3://bucket/key"
  std::string payload_sha256;
  std::string range;  // a GET's "first-last" bytes (the Range header); "" for the whole object
};

struct Response {
  CURLcode curl_code = CURLE_OK;
  std::string curl_error;
  long status = 0;
  std::string body;
  std::string etag;           // the ETag header (UploadPart)
  std::string bucket_region;  // x-amz-bucket-region, sent when the region is wrong

  bool failed(const Request& req) const {
    return curl_code != CURLE_OK || status < 200 || status >= 300 ||
           (req.error_in_200 && body.find("<Error>") != std::string::npos);
  }
  std::string code() const { return xml_text(body, "Code"); }
  // Worth another attempt: the connection broke, or S3 said to slow down or try again.
  bool transient() const {
    switch (curl_code) {
      case CURLE_OK:
        break;
      case CURLE_UNSUPPORTED_PROTOCOL:
      case CURLE_URL_MALFORMAT:
      case CURLE_OUT_OF_MEMORY:
      case CURLE_PEER_FAILED_VERIFICATION:
      case CURLE_SSL_CERTPROBLEM:
      case CURLE_SSL_CACERT_BADFILE:
      case CURLE_LOGIN_DENIED:
        return false;
      default:
        return true;
    }
    const std::string c = code();
    return status >= 500 || status == 429 || c == "SlowDown" || c == "RequestTimeout" ||
           c == "InternalError";
  }
  // A sentence: "HTTP 403 AccessDenied: Access Denied." or "curl error 7 (...): Failed to ...".
  std::string describe() const {
    std::string s;
    if (curl_code != CURLE_OK) {
      s = detail::concat("curl error ", static_cast<int>(curl_code), " (",
                         curl_easy_strerror(curl_code), "): ", curl_error);
    } else if (const std::string c = code(); c.empty()) {
      s = detail::concat("HTTP ", status, " with no S3 error code");
    } else {
      const std::string message = xml_text(body, "Message");
      s = detail::concat("HTTP ", status, " ", c, message.empty() ? "" : ": ", message);
    }
    return s.ends_with('.') ? s : s + ".";
  }
};

std::size_t on_body(char* data, std::size_t size, std::size_t n, void* user) {
  static_cast<Response*>(user)->body.append(data, size * n);
  return size * n;
}

std::size_t on_header(char* data, std::size_t size, std::size_t n, void* user) {
  auto* r = static_cast<Response*>(user);
  std::string_view line(data, size * n);
  const std::size_t colon = line.find(':');
  if (colon == std::string_view::npos) return size * n;
  std::string name(line.substr(0, colon));
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  std::string_view value = line.substr(colon + 1);
  while (!value.empty() && std::isspace(static_cast<unsigned char>(value.front())) != 0) {
    value.remove_prefix(1);
  }
  while (!value.empty() && std::isspace(static_cast<unsigned char>(value.back())) != 0) {
    value.remove_suffix(1);
  }
  if (name == "etag") r->etag = value;
  if (name == "x-amz-bucket-region") r->bucket_region = value;
  if (name == "content-length") {
    // Reserve up front so a large object is not copied while the buffer grows.
    const unsigned long long len = std::strtoull(std::string(value).c_str(), nullptr, 10);
    if (len <= kMaxObjectPut) r->body.reserve(len);
  }
  return size * n;
}

struct CurlDeleter {
  void operator()(CURL* h) const { curl_easy_cleanup(h); }
};
using CurlHandle = std::unique_ptr<CURL, CurlDeleter>;

// Shared by send() and the progress callback of its attempts (same thread).
struct Waiting {
  using Clock = std::chrono::steady_clock;
  const Request* req = nullptr;
  const S3Config* config = nullptr;
  const std::string* endpoint = nullptr;
  Clock::time_point first{};          // the request's first attempt began
  Clock::time_point attempt_start{};  // this attempt began
  Clock::time_point last_moved{};     // this attempt last sent or received bytes (or began)
  curl_off_t moved = 0;               // bytes this attempt has sent and received
  Clock::time_point last_warning{};   // a warning about this request was logged
  int attempt = 0;

  bool may_warn(Clock::time_point now) const {
    // A transfer that moves data (a large upload) is not waiting for an answer.
    return now - last_warning >= config->warn_every && now - last_moved >= config->warn_every;
  }
};

double seconds_between(std::chrono::steady_clock::time_point a,
                       std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Called by curl about once a second during an attempt: warns while an answer is overdue. A
// request is bounded (stall_timeout per attempt, retry_deadline in all), so waiting for it is
// progress for the hang watchdog (Note [Hang watchdog] in src/elastic/rank_monitor.cpp), when the
// waiting thread is the training thread or one it waits for: a rank riding out a short S3 outage
// is not taken for hung; one stuck past the deadline fails.
int on_progress(void* user, curl_off_t, curl_off_t received, curl_off_t, curl_off_t sent) {
  heartbeat_while_waiting();
  auto* w = static_cast<Waiting*>(user);
  const auto now = std::chrono::steady_clock::now();
  if (received + sent != w->moved) {
    w->moved = received + sent;
    w->last_moved = now;
  }
  if (w->may_warn(now)) {
    w->last_warning = now;
    logger("s3")->warn(
        "Still waiting for {} to answer {} (attempt {}: {:.0f} s; {:.0f} s since the first "
        "attempt). An attempt that moves no data for {} s is abandoned and retried until {} s "
        "have passed.",
        *w->endpoint, w->req->what, w->attempt, seconds_between(w->attempt_start, now),
        seconds_between(w->first, now), w->config->stall_timeout.count(),
        w->config->retry_deadline.count());
  }
  return 0;
}

// Thread-safe: each request runs on a curl handle of its own, taken from a pool of idle ones.
class S3Storage final : public Storage {
 public:
  explicit S3Storage(S3Config config);

  void write(const std::string& key, std::string_view data) override;
  std::optional<std::string> read(const std::string& key) override;
  std::optional<std::string> read_range(const std::string& key,
                                        std::uint64_t offset,
                                        std::uint64_t length) override;
  std::vector<std::string> list(const std::string& prefix) override;
  void remove(const std::string& key) override;
  std::string uri() const override { return uri_; }

 private:
  std::string object_key(const std::string& key) const;
  std::string object_uri(const std::string& object) const {
    return "s3://" + c_.bucket + "/" + object;
  }
  void write_multipart(const std::string& object, std::string_view data);
  // Sends req, retrying transient failures (see Response::transient) with backoff. Returns the
  // final answer, which may be an HTTP error the caller handles; throws NetworkError when every
  // attempt failed transiently.
  Response send(Request req);
  Response perform(CURL* h, const Request& req, Waiting* waiting) const;
  [[noreturn]] void fail(const Request& req, const Response& r) const;
  std::string hint(const Response& r) const;  // " HINT: ..." or ""

  CurlHandle acquire();
  void release(CurlHandle h);

  const S3Config c_;
  std::string uri_;       // s3://bucket[/prefix]
  std::string endpoint_;  // the server, for messages: "http://127.0.0.1:4568"
  std::string base_url_;  // "https://bucket.s3.region.amazonaws.com" or "<endpoint>/bucket"
  std::string sigv4_;     // "aws:amz:<region>:s3"
  std::mutex mu_;
  std::vector<CurlHandle> idle_;  // finished handles, kept to reuse their connections; mu_
};

S3Storage::S3Storage(S3Config config) : c_(std::move(config)) {
  static std::once_flag curl_init;
  std::call_once(curl_init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  uri_ = "s3://" + c_.bucket + (c_.prefix.empty() ? "" : "/" + c_.prefix);
  sigv4_ = "aws:amz:" + c_.region + ":s3";
  endpoint_ = c_.endpoint;
  while (endpoint_.ends_with('/')) endpoint_.pop_back();
  const bool path_style = !endpoint_.empty() || c_.bucket.find('.') != std::string::npos;
  if (endpoint_.empty()) {
    // A dotted bucket name does not match AWS's *.s3 wildcard certificate: path-style for it.
    endpoint_ = path_style ? "https://s3." + c_.region + ".amazonaws.com"
                           : "https://" + c_.bucket + ".s3." + c_.region + ".amazonaws.com";
  }
  base_url_ = path_style ? endpoint_ + "/" + c_.bucket : endpoint_;
  logger("s3")->info("Opened {} at {} (region {}, {} addressing)", uri_, base_url_, c_.region,
                     path_style ? "path-style" : "virtual-hosted");
}

std::string S3Storage::object_key(const std::string& key) const {
  TY_CHECK(!key.empty() && key.front() != '/', "S3 storage ", uri_,
           ": a key must be a non-empty relative path, got '", key, "'.");
  return c_.prefix.empty() ? key : c_.prefix + "/" + key;
}

CurlHandle S3Storage::acquire() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      CurlHandle h = std::move(idle_.back());
      idle_.pop_back();
      return h;
    }
  }
  CurlHandle h(curl_easy_init());
  TY_CHECK_T(Error, h != nullptr, "curl_easy_init failed for S3 storage ", uri_);
  return h;
}

void S3Storage::release(CurlHandle h) {
  std::lock_guard<std::mutex> lock(mu_);
  idle_.push_back(std::move(h));
}

// Note [SigV4 with curl]
// libcurl computes the signature, but Debian 12's curl 7.88 signs the URL's path and query as they
// are, so the caller must already give them in SigV4's canonical form: every key segment
// percent-encoded (uri_encode), query parameters sorted by name and encoded, "uploads=" rather
// than "uploads". It also signs every custom header, even an empty one that only removes a
// header curl would add, so no such header may be set. The payload hash comes from our
// x-amz-content-sha256 header. These were checked against an independent SigV4 implementation;
// s3rver, which the tests run against, checks the access key but not the signature.
Response S3Storage::perform(CURL* h, const Request& req, Waiting* waiting) const {
  Response r;
  char errbuf[CURL_ERROR_SIZE] = {0};
  const std::string url =
      base_url_ + "/" + uri_encode(req.key, true) + (req.query.empty() ? "" : "?" + req.query);
  const std::string_view method = req.method;
  // The payload hash is part of the signature, and S3 checks the body against it.
  std::vector<std::string> headers = {"x-amz-content-sha256: " + req.payload_sha256};
  if (method == "PUT" || method == "POST") {
    headers.push_back(std::string("Content-Type: ") + req.content_type);
  }
  if (!c_.session_token.empty()) headers.push_back("x-amz-security-token: " + c_.session_token);
  curl_slist* list = nullptr;
  for (const auto& line : headers) list = curl_slist_append(list, line.c_str());

  curl_easy_reset(h);  // keeps the connection cache
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);  // keys like "a/../b" must reach S3 unchanged
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(c_.connect_timeout.count()));
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(c_.request_timeout.count()));
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);  // bytes/s, see S3Config.stall_timeout
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, static_cast<long>(c_.stall_timeout.count()));
  curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(h, CURLOPT_XFERINFODATA, waiting);
  curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sigv4_.c_str());
  curl_easy_setopt(h, CURLOPT_USERNAME, c_.access_key_id.c_str());
  curl_easy_setopt(h, CURLOPT_PASSWORD, c_.secret_access_key.c_str());
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &r);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &r);
  if (method == "PUT" || method == "POST") {
    // Both go out the way curl sends a POST, from memory: as an upload (CURLOPT_UPLOAD) even a
    // tiny body would wait for "100 Continue", and an empty "Expect:" header to stop that would
    // be signed (Note [SigV4 with curl]). POST asks for 100 Continue only above 1 MiB.
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, req.body.empty() ? "" : req.body.data());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
  }
  if (!req.range.empty()) curl_easy_setopt(h, CURLOPT_RANGE, req.range.c_str());
  if (method != "GET" && method != "POST") curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, req.method);
  r.curl_code = curl_easy_perform(h);
  if (r.curl_code != CURLE_OK) {
    r.curl_error = errbuf[0] != '\0' ? errbuf : curl_easy_strerror(r.curl_code);
  } else {
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.status);
  }
  curl_slist_free_all(list);
  return r;
}

// Note [S3 retry deadline]
// A frozen or failing endpoint must neither stall training for many minutes nor fail a job
// within seconds of a short outage. Each attempt is bounded (connect_timeout, stall_timeout,
// request_timeout); failed transient attempts are retried with exponential backoff (doubling
// from initial_backoff to 10 s, half of it random so ranks do not retry in step) until the next
// attempt would start after retry_deadline. A warning names the request, the endpoint, the
// attempt and the time spent, at most every warn_every, both while an attempt waits and between
// attempts; the final error says how many attempts over how long, with each failure.
Response S3Storage::send(Request req) {
  using Clock = std::chrono::steady_clock;
  req.payload_sha256 = sha256_hex(req.body);
  struct Failure {
    std::string what;
    int first = 0, last = 0;  // attempts
  };
  std::vector<Failure> failures;  // consecutive identical failures share one entry
  auto backoff = c_.initial_backoff;
  std::minstd_rand jitter(std::random_device{}());
  Waiting w{.req = &req, .config = &c_, .endpoint = &endpoint_, .first = Clock::now()};
  w.last_warning = w.first - c_.warn_every;
  for (int attempt = 1;; ++attempt) {
    CurlHandle h = acquire();
    w.attempt = attempt;
    w.attempt_start = Clock::now();
    w.last_moved = w.attempt_start;
    w.moved = 0;
    Response r = perform(h.get(), req, &w);
    release(std::move(h));
    const auto now = Clock::now();
    logger("s3")->debug("{} -> {} in {:.3f} s (attempt {})", req.what,
                        r.curl_code == CURLE_OK ? std::to_string(r.status) : r.curl_error,
                        seconds_between(w.attempt_start, now), attempt);
    if (!r.failed(req)) {
      if (attempt > 1) {
        logger("s3")->info("{} succeeded at attempt {}, {:.1f} s after the first.", req.what,
                           attempt, seconds_between(w.first, now));
      }
      return r;
    }
    if (!r.transient()) {
      if (r.curl_code == CURLE_OK) return r;  // an HTTP error the caller interprets
      throw NetworkError(detail::concat("S3 ", req.what, " failed against ", endpoint_, ": ",
                                        r.describe(), hint(r)));
    }
    const std::string what = r.describe();
    if (!failures.empty() && failures.back().what == what) {
      failures.back().last = attempt;
    } else {
      failures.push_back({what, attempt, attempt});
    }
    // Half the backoff plus a random half, so that many ranks retrying do not move in step.
    const auto half = backoff.count() / 2;
    const auto sleep = std::chrono::milliseconds(
        half + std::uniform_int_distribution<long long>(0, std::max<long long>(half, 0))(jitter));
    backoff = std::min(backoff * 2, kMaxBackoff);
    const bool capped = c_.max_attempts > 0 && attempt >= c_.max_attempts;
    if (capped || now + sleep - w.first > c_.retry_deadline) {
      std::string listed;
      for (std::size_t i = 0; i < failures.size(); ++i) {
        if (failures.size() > 8 && i == 4) {
          listed += detail::concat(" (", failures.size() - 8, " more kinds of failure)");
          i = failures.size() - 4;
        }
        const auto& f = failures[i];
        listed += f.first == f.last
                      ? detail::concat(" Attempt ", f.first, ": ", f.what)
                      : detail::concat(" Attempts ", f.first, "-", f.last, ": ", f.what);
      }
      throw NetworkError(
          detail::concat("S3 ", req.what, " failed after ", attempt, " attempt(s) against ",
                         endpoint_, " in ", fmt::format("{:.1f}", seconds_between(w.first, now)),
                         " s (S3Config.retry_deadline = ", c_.retry_deadline.count(),
                         " s, max_attempts = ", c_.max_attempts, ").", listed, hint(r)));
    }
    if (w.may_warn(now) || attempt == 1) {
      w.last_warning = now;
      logger("s3")->warn(
          "{} against {} failed at attempt {} ({:.1f} s since the first): {} Retrying in {} ms, "
          "until {} s have passed.",
          req.what, endpoint_, attempt, seconds_between(w.first, now), what, sleep.count(),
          c_.retry_deadline.count());
    }
    // In slices, beating between them (see on_progress): backoffs reach kMaxBackoff.
    for (auto left = sleep; left.count() > 0; left -= std::chrono::seconds(1)) {
      heartbeat_while_waiting();
      std::this_thread::sleep_for(
          std::min<std::chrono::milliseconds>(left, std::chrono::seconds(1)));
    }
  }
}

std::string S3Storage::hint(const Response& r) const {
  if (r.curl_code == CURLE_OPERATION_TIMEDOUT) {
    return detail::concat(" HINT: is ", endpoint_,
                          " reachable and answering? An attempt times out "
                          "after ",
                          c_.connect_timeout.count(), " ms to connect, ", c_.stall_timeout.count(),
                          " s without data or ", c_.request_timeout.count(),
                          " ms in all (S3Config.connect_timeout, stall_timeout, request_timeout; "
                          "retries end after retry_deadline, ",
                          kS3RetryDeadlineEnv, ").");
  }
  if (r.curl_code == CURLE_COULDNT_RESOLVE_HOST) {
    return " HINT: check the endpoint's host name (AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL) and DNS.";
  }
  if (r.curl_code == CURLE_PEER_FAILED_VERIFICATION || r.curl_code == CURLE_SSL_CACERT_BADFILE) {
    return " HINT: the endpoint's TLS certificate could not be verified.";
  }
  if (r.curl_code != CURLE_OK) {
    return detail::concat(" HINT: is the endpoint ", endpoint_, " running and reachable?");
  }
  const std::string code = r.code();
  if (!r.bucket_region.empty() && r.bucket_region != c_.region) {
    return detail::concat(" HINT: bucket '", c_.bucket, "' is in region ", r.bucket_region,
                          ", not ", c_.region, "; set AWS_REGION=", r.bucket_region, ".");
  }
  if (code == "NoSuchBucket") {
    return detail::concat(" HINT: create bucket '", c_.bucket, "' or fix the URI.");
  }
  if (code == "InvalidAccessKeyId" || code == "SignatureDoesNotMatch") {
    return " HINT: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.";
  }
  if (code == "ExpiredToken" || code == "InvalidToken" || code == "TokenRefreshRequired") {
    return " HINT: the temporary credentials are stale; refresh AWS_SESSION_TOKEN with its keys.";
  }
  if (code == "RequestTimeTooSkewed") return " HINT: this machine's clock is off; sync it (NTP).";
  if (r.status == 403) {
    return " HINT: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, and that they may use this "
           "bucket (S3 also answers 403, not 404, for a missing key without s3:ListBucket).";
  }
  if (r.transient()) return " HINT: the service is overloaded or failing; try again later.";
  return "";
}

void S3Storage::fail(const Request& req, const Response& r) const {
  throw Error(detail::concat("S3 ", req.what, " failed: ", r.describe(), hint(r)));
}

void S3Storage::write(const std::string& key, std::string_view data) {
  const std::string object = object_key(key);
  if (data.size() > c_.multipart_threshold) return write_multipart(object, data);
  Request put{.method = "PUT", .key = object, .body = data, .what = "PUT " + object_uri(object)};
  Response r = send(put);
  if (r.failed(put)) fail(put, r);
}

// Note [Multipart upload]
// CreateMultipartUpload gives an UploadId; each part is PUT with its number and answers an ETag;
// CompleteMultipartUpload lists (number, ETag) and makes the object appear at once, which keeps
// write() atomic. On any failure the upload is aborted, or its parts would be billed forever.
void S3Storage::write_multipart(const std::string& object, std::string_view data) {
  // Bigger parts when the configured size would need more than S3's 10,000.
  const std::size_t part_size = std::max(c_.part_size, (data.size() + kMaxParts - 1) / kMaxParts);
  const std::string where = object_uri(object);
  Request create{.method = "POST",
                 .key = object,
                 .query = "uploads=",
                 .what = "CreateMultipartUpload " + where};
  Response r = send(create);
  if (r.failed(create)) fail(create, r);
  const std::string upload_id = xml_text(r.body, "UploadId");
  TY_CHECK_T(Error, !upload_id.empty(), "S3 ", create.what,
             " answered no UploadId: ", r.body.substr(0, 300));
  const std::string upload_query = "uploadId=" + uri_encode(upload_id, false);
  try {
    const std::size_t parts = (data.size() + part_size - 1) / part_size;
    std::string xml =
        R"(<CompleteMultipartUpload xmlns="http://s3.amazonaws.com/doc/2006-03-01/">)";
    for (std::size_t i = 0; i < parts; ++i) {
      const std::string number = std::to_string(i + 1);
      Request part{.method = "PUT",
                   .key = object,
                   .query = "partNumber=" + number + "&" + upload_query,
                   .body = data.substr(i * part_size, part_size),
                   .what = detail::concat("UploadPart ", i + 1, "/", parts, " of ", where)};
      r = send(part);
      if (r.failed(part)) fail(part, r);
      TY_CHECK_T(Error, !r.etag.empty(), "S3 ", part.what, " answered no ETag.");
      xml += "<Part><PartNumber>" + number + "</PartNumber><ETag>" + xml_escape(r.etag) +
             "</ETag></Part>";
    }
    xml += "</CompleteMultipartUpload>";
    Request complete{.method = "POST",
                     .key = object,
                     .query = upload_query,
                     .body = xml,
                     .content_type = "application/xml",
                     .error_in_200 = true,
                     .what = "CompleteMultipartUpload " + where};
    r = send(complete);
    if (r.failed(complete)) fail(complete, r);
  } catch (const std::exception&) {
    try {
      Request abort{.method = "DELETE",
                    .key = object,
                    .query = upload_query,
                    .what = "AbortMultipartUpload " + where};
      if (Response a = send(abort); a.failed(abort)) fail(abort, a);
    } catch (const std::exception& e) {
      logger("s3")->warn("{} (upload id {}); its parts stay until a lifecycle rule removes them.",
                         e.what(), upload_id);
    }
    throw;
  }
}

std::optional<std::string> S3Storage::read(const std::string& key) {
  const std::string object = object_key(key);
  Request get{.method = "GET", .key = object, .what = "GET " + object_uri(object)};
  Response r = send(get);
  if (r.status == 404 && r.code() == "NoSuchKey") return std::nullopt;
  if (r.failed(get)) fail(get, r);
  return std::move(r.body);
}

std::optional<std::string> S3Storage::read_range(const std::string& key,
                                                 std::uint64_t offset,
                                                 std::uint64_t length) {
  if (length == 0) {  // no Range header says "no bytes": ask for one to learn whether it exists
    if (!read_range(key, offset, 1)) return std::nullopt;
    return std::string();
  }
  const std::string object = object_key(key);
  Request get{.method = "GET",
              .key = object,
              .what = detail::concat("GET ", object_uri(object), " bytes ", offset, "-",
                                     offset + length - 1),
              .range = detail::concat(offset, "-", offset + length - 1)};
  Response r = send(get);
  if (r.status == 404 && r.code() == "NoSuchKey") return std::nullopt;
  if (r.status == 416) return std::string();  // the range starts at or past the end
  if (r.failed(get)) fail(get, r);
  // A server that ignores Range answers 200 with the whole object.
  if (r.status == 200 && r.body.size() > length)
    return offset >= r.body.size() ? std::string() : r.body.substr(offset, length);
  return std::move(r.body);
}

std::vector<std::string> S3Storage::list(const std::string& prefix) {
  const std::string root = c_.prefix.empty() ? "" : c_.prefix + "/";
  const std::string full_prefix = root + prefix;
  std::vector<std::string> keys;
  std::string token;
  do {
    // Parameters in sorted order (SigV4's canonical query string).
    std::string query;
    if (!token.empty()) query += "continuation-token=" + uri_encode(token, false) + "&";
    query += "list-type=2&prefix=" + uri_encode(full_prefix, false);
    Request page{.method = "GET",
                 .query = std::move(query),
                 .what = "ListObjectsV2 s3://" + c_.bucket + "/" + full_prefix + "*"};
    Response r = send(page);
    if (r.failed(page)) fail(page, r);
    for (std::string_view contents : xml_elements(r.body, "Contents")) {
      std::string key = xml_text(contents, "Key");
      if (key.starts_with(root)) keys.push_back(key.substr(root.size()));
    }
    token =
        xml_text(r.body, "IsTruncated") == "true" ? xml_text(r.body, "NextContinuationToken") : "";
  } while (!token.empty());
  std::sort(keys.begin(), keys.end());
  return keys;
}

void S3Storage::remove(const std::string& key) {
  const std::string object = object_key(key);
  Request del{.method = "DELETE", .key = object, .what = "DELETE " + object_uri(object)};
  Response r = send(del);
  if (r.status == 404 && r.code() == "NoSuchKey") return;  // S3 says 204; some clones say 404
  if (r.failed(del)) fail(del, r);
}

}  // namespace

S3Config S3Config::from_uri(const std::string& uri, const EnvLookup& env) {
  constexpr std::string_view kScheme = "s3://";
  TY_CHECK(uri.starts_with(kScheme), "'", uri,
           "' is not an S3 URI; expected s3://bucket[/prefix].");
  const std::string_view rest = std::string_view(uri).substr(kScheme.size());
  const std::size_t slash = rest.find('/');
  S3Config c;
  c.bucket = rest.substr(0, slash);
  TY_CHECK(!c.bucket.empty(), "S3 URI '", uri, "' names no bucket; expected s3://bucket[/prefix].");
  if (slash != std::string_view::npos) {
    std::string_view prefix = rest.substr(slash + 1);
    while (prefix.starts_with('/')) prefix.remove_prefix(1);
    while (prefix.ends_with('/')) prefix.remove_suffix(1);
    c.prefix = prefix;
  }
  constexpr const char* kCredentialHint =
      " HINT: export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for "
      "temporary credentials); ~/.aws files and instance roles are not read.";
  c.access_key_id = env_or(env, "AWS_ACCESS_KEY_ID");
  TY_CHECK(!c.access_key_id.empty(), "S3 storage ", uri,
           " needs credentials, but AWS_ACCESS_KEY_ID", " is not set.", kCredentialHint);
  c.secret_access_key = env_or(env, "AWS_SECRET_ACCESS_KEY");
  TY_CHECK(!c.secret_access_key.empty(), "S3 storage ", uri,
           " needs credentials, but AWS_SECRET_ACCESS_KEY is not set.", kCredentialHint);
  c.session_token = env_or(env, "AWS_SESSION_TOKEN");
  if (std::string region = env_or(env, "AWS_REGION", "AWS_DEFAULT_REGION"); !region.empty()) {
    c.region = region;
  }
  c.endpoint = env_or(env, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL");
  if (const std::string deadline = env_or(env, kS3RetryDeadlineEnv); !deadline.empty()) {
    const auto seconds = parse_seconds(deadline, 1, 86'400);
    TY_CHECK(seconds.has_value(), kS3RetryDeadlineEnv, "='", deadline,
             "' is not a number of seconds in [1, 86400].");
    c.retry_deadline = std::chrono::duration_cast<std::chrono::seconds>(*seconds);
  }
  return c;
}

std::unique_ptr<Storage> make_s3_storage(S3Config config) {
  const auto& c = config;
  TY_CHECK(!c.bucket.empty() && c.bucket.find_first_not_of("abcdefghijklmnopqrstuvwxyz"
                                                           "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                           "0123456789.-_") == std::string::npos,
           "S3Config.bucket '", c.bucket,
           "' is not a bucket name (letters, digits, '.', '-', '_').");
  TY_CHECK(!c.prefix.starts_with('/') && !c.prefix.ends_with('/'), "S3Config.prefix '", c.prefix,
           "' must not start or end with '/'.");
  TY_CHECK(
      c.endpoint.empty() || c.endpoint.starts_with("http://") || c.endpoint.starts_with("https://"),
      "S3Config.endpoint '", c.endpoint,
      "' must start with http:// or https:// (it comes from AWS_ENDPOINT_URL_S3 or "
      "AWS_ENDPOINT_URL).");
  TY_CHECK(!c.region.empty() && c.region.find_first_not_of(
                                    "abcdefghijklmnopqrstuvwxyz0123456789-") == std::string::npos,
           "S3Config.region '", c.region, "' is not a region name such as us-east-1 (AWS_REGION).");
  TY_CHECK(!c.access_key_id.empty() && !c.secret_access_key.empty(),
           "S3Config needs access_key_id and secret_access_key (AWS_ACCESS_KEY_ID, "
           "AWS_SECRET_ACCESS_KEY).");
  TY_CHECK(c.session_token.find_first_of("\r\n") == std::string::npos,
           "S3Config.session_token (AWS_SESSION_TOKEN) contains a line break.");
  TY_CHECK(c.part_size >= kMinPartSize && c.part_size <= kMaxObjectPut,
           "S3Config.part_size = ", c.part_size, " is outside S3's limits [5 MiB, 5 GiB].");
  TY_CHECK(c.multipart_threshold <= kMaxObjectPut,
           "S3Config.multipart_threshold = ", c.multipart_threshold,
           " is above S3's 5 GiB limit for one PUT.");
  TY_CHECK(c.max_attempts >= 0, "S3Config.max_attempts = ", c.max_attempts,
           " must be >= 0 (0: retry until retry_deadline).");
  TY_CHECK(c.connect_timeout.count() > 0 && c.request_timeout.count() > 0 &&
               c.stall_timeout.count() > 0 && c.retry_deadline.count() >= 0,
           "S3Config timeouts must be positive: connect_timeout = ", c.connect_timeout.count(),
           " ms, stall_timeout = ", c.stall_timeout.count(),
           " s, request_timeout = ", c.request_timeout.count(),
           " ms, retry_deadline = ", c.retry_deadline.count(), " s (0: no retries).");
  TY_CHECK(c.initial_backoff.count() >= 0, "S3Config.initial_backoff = ", c.initial_backoff.count(),
           " ms must not be negative.");
  return std::make_unique<S3Storage>(std::move(config));
}

}  // namespace trainyard::storage
