// S3Storage: checkpoint storage on Amazon S3 or an S3-compatible service. Requests go through
// net::HttpClient, where libcurl signs each one (CURLOPT_AWS_SIGV4); the few XML answers S3 gives
// (ListObjectsV2, multipart upload, errors) are read by a small parser below. See s3_storage.h for
// the behaviour.
#include "trainyard/storage/s3_storage.h"
#include "trainyard/env.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "storage/aws_text.h"
#include "trainyard/error.h"
#include "trainyard/heartbeat.h"
#include "trainyard/log.h"
#include "trainyard/net/http_client.h"
#include "trainyard/net/xml_escape.h"
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
  std::string range;  // a GET's "first-last" bytes (the Range header); "" for the whole object
};

// S3's error code in an answer's <Error> body ("NoSuchKey"), or "".
std::string s3_code(const net::HttpResponse& r) {
  return xml_text(r.body, "Code");
}

bool failed(const Request& req, const net::HttpResponse& r) {
  return r.status < 200 || r.status >= 300 ||
         (req.error_in_200 && r.body.find("<Error>") != std::string::npos);
}

// Worth another attempt (for a failed answer): S3 said to slow down or try again.
bool transient(const net::HttpResponse& r) {
  const std::string c = s3_code(r);
  return r.status >= 500 || r.status == 429 || c == "SlowDown" || c == "RequestTimeout" ||
         c == "InternalError";
}

// A sentence: "HTTP 403 AccessDenied: Access Denied." (transport failures: HttpClient's
// "curl error 7 (...): Failed to ...").
std::string describe(const net::HttpResponse& r) {
  std::string s;
  if (const std::string c = s3_code(r); c.empty()) {
    s = detail::concat("HTTP ", r.status, " with no S3 error code");
  } else {
    const std::string message = xml_text(r.body, "Message");
    s = detail::concat("HTTP ", r.status, " ", c, message.empty() ? "" : ": ", message);
  }
  return s.ends_with('.') ? s : s + ".";
}

double seconds_between(std::chrono::steady_clock::time_point a,
                       std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Shared by the progress and retry callbacks of one request (same thread): when to warn.
struct Waiting {
  using Clock = std::chrono::steady_clock;
  int attempt = 0;                   // the attempt last seen by the progress callback
  Clock::time_point last_moved{};    // that attempt last sent or received bytes (or began)
  std::uint64_t moved = 0;           // bytes that attempt has sent and received
  Clock::time_point last_warning{};  // a warning about this request was logged
};

// Thread-safe: requests run on HttpClient, which is.
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
  // Sends req, retrying transient failures (see transient()) with backoff. Returns the final
  // answer, which may be an HTTP error the caller handles; throws NetworkError when every
  // attempt failed transiently, or the connection failed in a way retrying cannot fix.
  net::HttpResponse send(const Request& req);
  [[noreturn]] void fail(const Request& req, const net::HttpResponse& r) const;
  // " HINT: ..." or "", for a transport failure or (kNone) the answer r.
  std::string hint(net::TransportError transport, const net::HttpResponse* r) const;

  const S3Config c_;
  std::string uri_;       // s3://bucket[/prefix]
  std::string endpoint_;  // the server, for messages: "http://127.0.0.1:4568"
  std::string base_url_;  // "https://bucket.s3.region.amazonaws.com" or "<endpoint>/bucket"
  std::string sigv4_;     // "aws:amz:<region>:s3"
  net::HttpClient http_;
};

S3Storage::S3Storage(S3Config config) : c_(std::move(config)) {
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

// Note [SigV4 with curl]
// libcurl computes the signature, but Debian 12's curl 7.88 signs the URL's path and query as they
// are, so the caller must already give them in SigV4's canonical form: every key segment
// percent-encoded (uri_encode), query parameters sorted by name and encoded, "uploads=" rather
// than "uploads". It also signs every custom header, even an empty one that only removes a
// header curl would add, so no such header may be set (HttpClient adds none to a signed
// request). The payload hash comes from our x-amz-content-sha256 header. These were checked
// against an independent SigV4 implementation, and moto's S3 server, which the tests run against,
// recomputes every request's signature with the key's secret.
//
// Note [S3 retry deadline]
// A frozen or failing endpoint must neither stall training for many minutes nor fail a job
// within seconds of a short outage. Each attempt is bounded (connect_timeout, stall_timeout,
// request_timeout); failed transient attempts are retried with exponential backoff (doubling
// from initial_backoff to 10 s, half of it random so ranks do not retry in step) until the next
// attempt would start after retry_deadline (HttpClient::send, Note [One retry loop] in
// src/net/http_client.cpp). A warning names the request, the endpoint, the attempt and the time
// spent, at most every warn_every, both while an attempt waits and between attempts; the final
// error says how many attempts over how long, with each failure.
//
// A request is bounded, so waiting for it is progress for the hang watchdog (Note [Hang
// watchdog] in src/elastic/rank_monitor.cpp) when the waiting thread is the training thread or one
// it waits for: a rank riding out a short S3 outage is not taken for hung; one stuck past the
// deadline fails. The progress callback beats while attempts wait and between them.
net::HttpResponse S3Storage::send(const Request& req) {
  using Clock = std::chrono::steady_clock;
  const std::string_view method = req.method;
  // Per request, so that temporary credentials are refreshed mid-run (Note [Credential refresh]
  // in aws_credentials.cpp).
  const AwsCredentials creds = c_.credentials
                                   ? c_.credentials->fetch()
                                   : AwsCredentials{.access_key_id = c_.access_key_id,
                                                    .secret_access_key = c_.secret_access_key,
                                                    .session_token = c_.session_token};
  net::HttpRequest http{
      .method = req.method,
      .url = base_url_ + "/" + percent_encode(req.key, true) +
             (req.query.empty() ? "" : "?" + req.query),
      // The payload hash is part of the signature, and S3 checks the body against it.
      .headers = {{"x-amz-content-sha256", sha256_hex(req.body)}},
      .body_ref = req.body,
      .range = req.range,
      .connect_timeout = c_.connect_timeout,
      .timeout = c_.request_timeout,
      .stall_timeout = c_.stall_timeout,
      .aws_sigv4 = net::AwsSigV4{.provider = sigv4_,
                                 .access_key_id = creds.access_key_id,
                                 .secret_access_key = creds.secret_access_key}};
  if (method == "PUT" || method == "POST")
    http.headers.emplace_back("Content-Type", req.content_type);
  if (!creds.session_token.empty())
    http.headers.emplace_back("x-amz-security-token", creds.session_token);

  const auto first = Clock::now();
  Waiting w{.last_warning = first - c_.warn_every};
  http.on_progress = [&](const net::HttpProgress& p) {
    heartbeat_while_waiting();
    if (p.between_attempts) return;
    const auto now = Clock::now();
    if (p.attempt != w.attempt) {
      w.attempt = p.attempt;
      w.moved = 0;
      w.last_moved = p.attempt_start;
    }
    if (p.bytes_moved != w.moved) {
      w.moved = p.bytes_moved;
      w.last_moved = now;
    }
    // A transfer that moves data (a large upload) is not waiting for an answer.
    if (now - w.last_warning >= c_.warn_every && now - w.last_moved >= c_.warn_every) {
      w.last_warning = now;
      logger("s3")->warn(
          "Still waiting for {} to answer {} (attempt {}: {:.0f} s; {:.0f} s since the first "
          "attempt). An attempt that moves no data for {} s is abandoned and retried until {} s "
          "have passed.",
          endpoint_, req.what, p.attempt, seconds_between(p.attempt_start, now),
          seconds_between(p.first_start, now), c_.stall_timeout.count(), c_.retry_deadline.count());
    }
  };
  const net::RetryPolicy policy{
      .max_attempts = c_.retry_deadline.count() == 0 ? 1 : c_.max_attempts,
      .deadline = c_.retry_deadline,
      .backoff = c_.initial_backoff,
      .backoff_max = std::max(kMaxBackoff, c_.initial_backoff),
      .jitter = 0.5,  // half the backoff plus a random half
      .retry_if = [&](const net::HttpResponse& r) { return failed(req, r) && transient(r); },
      .describe = describe,
      .on_retry =
          [&](const net::RetryPolicy::Retry& r) {
            const auto now = Clock::now();
            if (r.failed_attempt == 1 || now - w.last_warning >= c_.warn_every) {
              w.last_warning = now;
              logger("s3")->warn(
                  "{} against {} failed at attempt {} ({:.1f} s since the first): {} Retrying in "
                  "{} ms, until {} s have passed.",
                  req.what, endpoint_, r.failed_attempt,
                  std::chrono::duration<double>(r.elapsed).count(), r.what, r.pause.count(),
                  c_.retry_deadline.count());
            }
          }};
  try {
    net::HttpResponse r = http_.send(http, policy);
    if (r.attempt > 1 && !failed(req, r)) {
      logger("s3")->info("{} succeeded at attempt {}, {:.1f} s after the first.", req.what,
                         r.attempt, seconds_between(first, Clock::now()));
    }
    return r;
  } catch (const net::HttpError& e) {
    const net::HttpResponse* last = e.last_response() ? &*e.last_response() : nullptr;
    if (!e.retryable()) {
      throw NetworkError(detail::concat("S3 ", req.what, " failed against ", endpoint_, ": ",
                                        e.log().entries.back().what, hint(e.transport(), last)));
    }
    throw NetworkError(detail::concat(
        "S3 ", req.what, " failed after ", e.log().attempts, " attempt(s) against ", endpoint_,
        " in ", fmt::format("{:.1f}", std::chrono::duration<double>(e.log().elapsed).count()),
        " s (S3Config.retry_deadline = ", c_.retry_deadline.count(),
        " s, max_attempts = ", c_.max_attempts, ").", e.log().list(), hint(e.transport(), last)));
  }
}

std::string S3Storage::hint(net::TransportError transport, const net::HttpResponse* r) const {
  using net::TransportError;
  if (transport == TransportError::kTimeout) {
    return detail::concat(" HINT: is ", endpoint_,
                          " reachable and answering? An attempt times out "
                          "after ",
                          c_.connect_timeout.count(), " ms to connect, ", c_.stall_timeout.count(),
                          " s without data or ", c_.request_timeout.count(),
                          " ms in all (S3Config.connect_timeout, stall_timeout, request_timeout; "
                          "retries end after retry_deadline, ",
                          kS3RetryDeadlineEnv, ").");
  }
  if (transport == TransportError::kResolve) {
    return " HINT: check the endpoint's host name (AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL) and DNS.";
  }
  if (transport == TransportError::kTlsVerify) {
    return " HINT: the endpoint's TLS certificate could not be verified.";
  }
  if (transport != TransportError::kNone || r == nullptr) {
    return detail::concat(" HINT: is the endpoint ", endpoint_, " running and reachable?");
  }
  const std::string code = s3_code(*r);
  const std::string bucket_region = r->header("x-amz-bucket-region").value_or("");
  if (!bucket_region.empty() && bucket_region != c_.region) {
    return detail::concat(" HINT: bucket '", c_.bucket, "' is in region ", bucket_region, ", not ",
                          c_.region, "; set AWS_REGION=", bucket_region, ".");
  }
  if (code == "NoSuchBucket") {
    return detail::concat(" HINT: create bucket '", c_.bucket, "' or fix the URI.");
  }
  // The static fields come from the environment (S3Config::from_uri) or the caller.
  const std::string keys = c_.credentials ? "the credentials from " + c_.credentials->name()
                                          : "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY";
  if (code == "InvalidAccessKeyId" || code == "SignatureDoesNotMatch") {
    return " HINT: check " + keys + ".";
  }
  if (code == "ExpiredToken" || code == "InvalidToken" || code == "TokenRefreshRequired") {
    if (c_.credentials) {
      return " HINT: " + keys +
             " were refused as expired although they are refreshed before they expire; is this "
             "machine's clock off? Sync it (NTP).";
    }
    return " HINT: the temporary credentials are stale; refresh AWS_SESSION_TOKEN with its keys, "
           "or unset the AWS_ACCESS_KEY_ID variables so that trainyard finds and refreshes "
           "credentials itself (web identity, ~/.aws profile, ECS task role, EC2 instance role).";
  }
  if (code == "RequestTimeTooSkewed") return " HINT: this machine's clock is off; sync it (NTP).";
  if (r->status == 403) {
    return " HINT: check " + keys +
           ", and that they may use this bucket (S3 also answers 403, not 404, for a missing key "
           "without s3:ListBucket).";
  }
  if (transient(*r)) return " HINT: the service is overloaded or failing; try again later.";
  return "";
}

void S3Storage::fail(const Request& req, const net::HttpResponse& r) const {
  throw Error(detail::concat("S3 ", req.what, " failed: ", describe(r),
                             hint(net::TransportError::kNone, &r)));
}
void S3Storage::write(const std::string& key, std::string_view data) {
  const std::string object = object_key(key);
  if (data.size() > c_.multipart_threshold) return write_multipart(object, data);
  Request put{.method = "PUT", .key = object, .body = data, .what = "PUT " + object_uri(object)};
  net::HttpResponse r = send(put);
  if (failed(put, r)) fail(put, r);
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
  net::HttpResponse r = send(create);
  if (failed(create, r)) fail(create, r);
  const std::string upload_id = xml_text(r.body, "UploadId");
  TY_CHECK_T(Error, !upload_id.empty(), "S3 ", create.what,
             " answered no UploadId: ", r.body.substr(0, 300));
  const std::string upload_query = "uploadId=" + percent_encode(upload_id);
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
      if (failed(part, r)) fail(part, r);
      const std::string etag = r.header("etag").value_or("");
      TY_CHECK_T(Error, !etag.empty(), "S3 ", part.what, " answered no ETag.");
      xml += "<Part><PartNumber>" + number + "</PartNumber><ETag>" + net::xml_escape(etag) +
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
    if (failed(complete, r)) fail(complete, r);
  } catch (const std::exception&) {
    try {
      Request abort{.method = "DELETE",
                    .key = object,
                    .query = upload_query,
                    .what = "AbortMultipartUpload " + where};
      if (net::HttpResponse a = send(abort); failed(abort, a)) fail(abort, a);
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
  net::HttpResponse r = send(get);
  if (r.status == 404 && s3_code(r) == "NoSuchKey") return std::nullopt;
  if (failed(get, r)) fail(get, r);
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
  net::HttpResponse r = send(get);
  if (r.status == 404 && s3_code(r) == "NoSuchKey") return std::nullopt;
  if (r.status == 416) return std::string();  // the range starts at or past the end
  if (failed(get, r)) fail(get, r);
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
    if (!token.empty()) query += "continuation-token=" + percent_encode(token) + "&";
    query += "list-type=2&prefix=" + percent_encode(full_prefix);
    Request page{.method = "GET",
                 .query = std::move(query),
                 .what = "ListObjectsV2 s3://" + c_.bucket + "/" + full_prefix + "*"};
    net::HttpResponse r = send(page);
    if (failed(page, r)) fail(page, r);
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
  net::HttpResponse r = send(del);
  if (r.status == 404 && s3_code(r) == "NoSuchKey") return;  // S3 says 204; some clones say 404
  if (failed(del, r)) fail(del, r);
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
  if (!env_or(env, kAwsAccessKeyIdEnv).empty() || !env_or(env, kAwsSecretAccessKeyEnv).empty()) {
    try {
      AwsCredentials creds = EnvironmentProvider(env).fetch();
      c.access_key_id = std::move(creds.access_key_id);
      c.secret_access_key = std::move(creds.secret_access_key);
      c.session_token = std::move(creds.session_token);
    } catch (const InvalidArgumentError& e) {
      throw InvalidArgumentError(detail::concat("S3 storage ", uri, ": ", e.what()));
    }
  } else {
    // Asked once now, so that a job without credentials fails at start, not at its first save.
    c.credentials = std::make_shared<CachingProvider>(default_credential_chain(env));
    try {
      c.credentials->fetch();
    } catch (const Error& e) {
      throw InvalidArgumentError(detail::concat("S3 storage ", uri, ": ", e.what()));
    }
  }
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
  TY_CHECK(c.credentials != nullptr || (!c.access_key_id.empty() && !c.secret_access_key.empty()),
           "S3Config needs access_key_id and secret_access_key (AWS_ACCESS_KEY_ID, "
           "AWS_SECRET_ACCESS_KEY), or a credentials provider.");
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
