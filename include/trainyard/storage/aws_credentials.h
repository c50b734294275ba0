// AWS credentials the way platforms hand them out: environment variables, ~/.aws profiles, EKS web
// identity (STS AssumeRoleWithWebIdentity), the ECS container endpoint and EC2 instance metadata
// (IMDSv2). default_credential_chain() tries them in the AWS SDKs' order; CachingProvider keeps
// temporary credentials and refreshes them before they expire. Endpoints are reached through
// net::HttpClient with short timeouts.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "trainyard/env.h"
#include "trainyard/net/http_client.h"

namespace trainyard::storage {

// The variables S3Config::from_uri and EnvironmentProvider read.
inline constexpr const char* kAwsAccessKeyIdEnv = "AWS_ACCESS_KEY_ID";
inline constexpr const char* kAwsSecretAccessKeyEnv = "AWS_SECRET_ACCESS_KEY";
inline constexpr const char* kAwsSessionTokenEnv = "AWS_SESSION_TOKEN";
// "true" keeps default_credential_chain() from asking EC2 instance metadata.
inline constexpr const char* kAwsEc2MetadataDisabledEnv = "AWS_EC2_METADATA_DISABLED";

struct AwsCredentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // temporary credentials; empty for long-term keys
  std::optional<std::chrono::system_clock::time_point> expiration;  // none: they do not expire
  // Where they came from, for messages: "profile 'dev' in /home/me/.aws/credentials".
  std::string source;
};

// One source of credentials.
class AwsCredentialProvider {
 public:
  virtual ~AwsCredentialProvider() = default;
  // Reads a file or asks an endpoint; blocks for a few seconds at most (each request has a
  // timeout). Throws an Error naming the provider, the file or URL and, where the user can fix it,
  // a HINT: InvalidArgumentError when it is not configured, NetworkError when an endpoint does not
  // answer. Whether it is thread-safe is said by each implementation.
  virtual AwsCredentials fetch() = 0;
  // For messages: "environment", "web identity", ...
  virtual std::string name() const = 0;
};

// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN. Thread-safe.
class EnvironmentProvider final : public AwsCredentialProvider {
 public:
  explicit EnvironmentProvider(EnvLookup env = process_env()) : env_(std::move(env)) {}
  AwsCredentials fetch() override;
  std::string name() const override { return "environment"; }

 private:
  EnvLookup env_;
};

// The profile AWS_PROFILE names ("default" when unset) from the shared credentials file
// (AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials; sections "[NAME]") and the config file
// (AWS_CONFIG_FILE, else ~/.aws/config; sections "[profile NAME]" and "[default]"), the former
// winning where both set a key. Only static keys are read (aws_access_key_id,
// aws_secret_access_key, aws_session_token); a profile that assumes a role (role_arn), runs a
// credential_process or uses SSO is an error saying so. Files are read again on every fetch.
// Thread-safe.
class ProfileProvider final : public AwsCredentialProvider {
 public:
  explicit ProfileProvider(EnvLookup env = process_env()) : env_(std::move(env)) {}
  AwsCredentials fetch() override;
  std::string name() const override { return "profile"; }

 private:
  EnvLookup env_;
};

// EKS IAM roles for service accounts: the token in AWS_WEB_IDENTITY_TOKEN_FILE (read again on
// every fetch, as the kubelet rotates it) is exchanged for temporary credentials of AWS_ROLE_ARN
// through STS AssumeRoleWithWebIdentity (an unsigned POST). The session is named
// AWS_ROLE_SESSION_NAME, else "trainyard-<unix time>". STS is AWS_ENDPOINT_URL_STS, else
// https://sts.<AWS_REGION or AWS_DEFAULT_REGION, else us-east-1>.amazonaws.com. Thread-safe.
class WebIdentityProvider final : public AwsCredentialProvider {
 public:
  explicit WebIdentityProvider(EnvLookup env = process_env()) : env_(std::move(env)) {}
  AwsCredentials fetch() override;
  std::string name() const override { return "web identity"; }

 private:
  EnvLookup env_;
  net::HttpClient http_;
};

// The ECS task role (and EKS Pod Identity): GET http://169.254.170.2<AWS_CONTAINER_CREDENTIALS_
// RELATIVE_URI>, or AWS_CONTAINER_CREDENTIALS_FULL_URI (https, or http to a loopback or the
// container endpoints' link-local address), with an Authorization header from
// AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE (read on every fetch) or
// AWS_CONTAINER_AUTHORIZATION_TOKEN. Thread-safe.
class EcsContainerProvider final : public AwsCredentialProvider {
 public:
  explicit EcsContainerProvider(EnvLookup env = process_env()) : env_(std::move(env)) {}
  AwsCredentials fetch() override;
  std::string name() const override { return "ECS container endpoint"; }

 private:
  EnvLookup env_;
  net::HttpClient http_;
};

// The EC2 instance profile through IMDSv2: PUT /latest/api/token for a session token, then the
// role's name and credentials under /latest/meta-data/iam/security-credentials/. The service is
// AWS_EC2_METADATA_SERVICE_ENDPOINT, else http://169.254.169.254; AWS_EC2_METADATA_DISABLED=true
// turns it off. Off EC2 nothing answers, so it gives up fast (1 s to connect, one try for the
// token). Thread-safe.
class ImdsV2Provider final : public AwsCredentialProvider {
 public:
  explicit ImdsV2Provider(EnvLookup env = process_env()) : env_(std::move(env)) {}
  AwsCredentials fetch() override;
  std::string name() const override { return "EC2 instance metadata"; }

 private:
  EnvLookup env_;
  net::HttpClient http_;
};

// Asks its providers in order and returns the first credentials one gives; a provider that fails
// is logged and the next one asked. When none gives any, throws InvalidArgumentError listing each
// provider's failure and each skipped one's reason. Thread-safe when its providers are.
class ChainProvider final : public AwsCredentialProvider {
 public:
  // `skipped`: sentences for providers left out because they are not configured, for the final
  // error ("web identity: AWS_WEB_IDENTITY_TOKEN_FILE is not set.").
  explicit ChainProvider(std::vector<std::unique_ptr<AwsCredentialProvider>> providers,
                         std::vector<std::string> skipped = {});
  AwsCredentials fetch() override;
  // The provider that gave the last credentials, else "default credential chain".
  std::string name() const override;

 private:
  std::vector<std::unique_ptr<AwsCredentialProvider>> providers_;
  std::vector<std::string> skipped_;
  mutable std::mutex mu_;
  std::string last_name_;  // mu_
};

// The AWS SDKs' order, each provider included only where it is configured in env: environment
// (AWS_ACCESS_KEY_ID or AWS_SECRET_ACCESS_KEY set), web identity (AWS_WEB_IDENTITY_TOKEN_FILE and
// AWS_ROLE_ARN set), profile (a credentials or config file exists, or AWS_PROFILE is set), ECS
// (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI or _FULL_URI set), EC2 instance metadata (unless
// AWS_EC2_METADATA_DISABLED=true). Contacts nothing until fetch().
std::unique_ptr<ChainProvider> default_credential_chain(const EnvLookup& env = process_env());

struct CachingOptions {
  // Refresh credentials that expire in less than this (the AWS SDKs' 5 minutes).
  std::chrono::seconds refresh_margin{300};
  // After a refresh attempt, the next one waits this long while the old credentials are valid
  // (a failing endpoint is not asked on every request).
  std::chrono::seconds retry_interval{10};
  // The current time; empty: system_clock::now. Tests move it.
  std::function<std::chrono::system_clock::time_point()> now;
};

// Keeps what `inner` gave and asks it again only when the credentials expire within
// refresh_margin. When that refresh fails while the old credentials are still valid, it logs a
// warning and returns the old ones; once they have expired, it throws inner's error.
// Thread-safe: one caller refreshes while the others wait for it.
class CachingProvider final : public AwsCredentialProvider {
 public:
  explicit CachingProvider(std::unique_ptr<AwsCredentialProvider> inner,
                           CachingOptions options = {});
  AwsCredentials fetch() override;
  std::string name() const override { return inner_->name(); }

 private:
  std::unique_ptr<AwsCredentialProvider> inner_;
  const CachingOptions options_;
  std::mutex mu_;
  std::optional<AwsCredentials> cached_;                // mu_
  std::chrono::system_clock::time_point next_attempt_;  // mu_; no refresh before this
};

}  // namespace trainyard::storage
