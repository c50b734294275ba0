// Storage on Amazon S3 or an S3-compatible service, through net::HttpClient (libcurl) with AWS
// Signature Version 4 signing (CURLOPT_AWS_SIGV4). Objects are written with one PUT, or as a
// multipart upload above multipart_threshold; reads are GETs, listing is ListObjectsV2 (paged).
// Every attempt is bounded: a connect timeout, a stall timeout (no byte moved for stall_timeout
// abandons it; a frozen endpoint costs seconds, not request_timeout) and a total timeout.
// Transient failures (connection errors, timeouts, HTTP 5xx, 429 and S3's SlowDown) are retried
// with exponential backoff and jitter until retry_deadline has passed since the first attempt,
// with a warning at most every warn_every while a request waits or retries.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "trainyard/env.h"
#include "trainyard/storage/aws_credentials.h"
#include "trainyard/storage/storage.h"

namespace trainyard::storage {

struct S3Config {
  std::string bucket;
  std::string prefix;  // key prefix inside the bucket, without leading or trailing '/'
  // Empty: AWS, https://<bucket>.s3.<region>.amazonaws.com (virtual-hosted style). Otherwise an
  // S3-compatible endpoint such as http://127.0.0.1:4568, addressed path-style
  // (<endpoint>/<bucket>/<key>).
  std::string endpoint;
  std::string region = "us-east-1";
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // temporary credentials; empty when none
  // When set, every request takes its credentials from this provider (a CachingProvider keeps
  // temporary ones fresh) and the three fields above are not used. Shared: copies of a config
  // share one cache.
  std::shared_ptr<AwsCredentialProvider> credentials;
  std::size_t multipart_threshold = 64u << 20;  // objects larger than this use multipart upload
  std::size_t part_size = 16u << 20;            // >= 5 MiB, as S3 requires (except the last part)
  // Retries of one request end when the next attempt would start after retry_deadline from the
  // first (an attempt under way is not cut short), or after max_attempts (0: no such cap).
  std::chrono::seconds retry_deadline{60};
  int max_attempts = 0;                            // per request, the first try included
  std::chrono::milliseconds initial_backoff{200};  // doubled after each failed attempt, to 10 s
  std::chrono::milliseconds connect_timeout{5'000};
  std::chrono::seconds stall_timeout{15};  // an attempt moving < 1 byte/s this long is abandoned
  std::chrono::milliseconds request_timeout{300'000};  // one attempt in all (large parts)
  std::chrono::seconds warn_every{5};  // warn while a request waits or retries, this often at most

  // Bucket and prefix from an s3://bucket/prefix URI; region from AWS_REGION, else
  // AWS_DEFAULT_REGION, else us-east-1; endpoint from AWS_ENDPOINT_URL_S3, else
  // AWS_ENDPOINT_URL; retry_deadline from TRAINYARD_S3_RETRY_DEADLINE (seconds). Credentials:
  // with AWS_ACCESS_KEY_ID or AWS_SECRET_ACCESS_KEY set, the static fields from them and
  // AWS_SESSION_TOKEN; otherwise `credentials` is a CachingProvider over
  // default_credential_chain(env) (web identity, ~/.aws profile, ECS, EC2 instance metadata),
  // asked once here, which may take a few seconds. Throws InvalidArgumentError for a malformed
  // URI or value, or missing credentials, naming what was tried and the variable to set.
  static S3Config from_uri(const std::string& uri, const EnvLookup& env = process_env());
};

// Validates config (InvalidArgumentError naming the field) without contacting the service. The
// storage is thread-safe; each call blocks until S3 answered or retries ended (about
// retry_deadline plus one attempt at most), then throws NetworkError saying how long it tried.
std::unique_ptr<Storage> make_s3_storage(S3Config config);

}  // namespace trainyard::storage
