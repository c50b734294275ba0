// AWS credential providers and the default chain; see aws_credentials.h. The endpoints' answers
// are small: JSON (ECS, IMDS) is read with nlohmann::json, STS's XML by taking the text of four
// elements.
#include "trainyard/storage/aws_credentials.h"

#include <nlohmann/json.hpp>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string_view>
#include <utility>

#include "storage/aws_text.h"
#include "trainyard/error.h"
#include "trainyard/log.h"

namespace trainyard::storage {
namespace {

using Clock = std::chrono::system_clock;
using namespace std::chrono_literals;

constexpr const char* kProfileEnv = "AWS_PROFILE";
constexpr const char* kSharedCredentialsFileEnv = "AWS_SHARED_CREDENTIALS_FILE";
constexpr const char* kConfigFileEnv = "AWS_CONFIG_FILE";
constexpr const char* kWebIdentityTokenFileEnv = "AWS_WEB_IDENTITY_TOKEN_FILE";
constexpr const char* kRoleArnEnv = "AWS_ROLE_ARN";
constexpr const char* kRoleSessionNameEnv = "AWS_ROLE_SESSION_NAME";
constexpr const char* kStsEndpointEnv = "AWS_ENDPOINT_URL_STS";
constexpr const char* kEcsRelativeUriEnv = "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI";
constexpr const char* kEcsFullUriEnv = "AWS_CONTAINER_CREDENTIALS_FULL_URI";
constexpr const char* kEcsAuthTokenEnv = "AWS_CONTAINER_AUTHORIZATION_TOKEN";
constexpr const char* kEcsAuthTokenFileEnv = "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE";
constexpr const char* kImdsEndpointEnv = "AWS_EC2_METADATA_SERVICE_ENDPOINT";

constexpr const char* kEcsHost = "http://169.254.170.2";
constexpr const char* kImdsDefaultEndpoint = "http://169.254.169.254";
constexpr const char* kImdsCredentialsPath = "/latest/meta-data/iam/security-credentials/";
constexpr const char* kImdsTokenTtlSeconds = "21600";

// Every endpoint here is either on the link-local network or STS: a second to connect is plenty,
// and off EC2 or ECS nothing answers, which must not hold up the chain.
constexpr std::chrono::milliseconds kConnectTimeout{1'000};
constexpr std::chrono::milliseconds kRequestTimeout{5'000};
const net::RetryPolicy kRetry{.max_attempts = 3, .backoff = 100ms, .backoff_max = 1'000ms};
const net::RetryPolicy kOneTry{.max_attempts = 1};

std::string env_value(const EnvLookup& env, const char* name) {
  return env(name).value_or("");
}

std::string trim(std::string_view s) {
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return "";
  return std::string(s.substr(first, s.find_last_not_of(" \t\r\n") - first + 1));
}

std::optional<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// "2024-05-01T12:34:56Z", with optional fractional seconds; AWS writes these times in UTC.
std::optional<Clock::time_point> parse_iso8601(const std::string& s) {
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, sec = 0, used = 0;
  if (std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &y, &mo, &d, &h, &mi, &sec, &used) != 6)
    return std::nullopt;
  std::string_view rest = std::string_view(s).substr(used);
  if (rest.starts_with('.')) {
    rest.remove_prefix(1);
    while (!rest.empty() && std::isdigit(static_cast<unsigned char>(rest.front())))
      rest.remove_prefix(1);
  }
  if (rest != "Z" && rest != "+00:00" && !rest.empty()) return std::nullopt;
  const std::chrono::year_month_day date{std::chrono::year(y), std::chrono::month(mo),
                                         std::chrono::day(d)};
  if (!date.ok() || h > 23 || mi > 59 || sec > 60) return std::nullopt;
  return std::chrono::sys_days(date) + std::chrono::hours(h) + std::chrono::minutes(mi) +
         std::chrono::seconds(sec);
}

Clock::time_point expiration_of(const std::string& text, const std::string& who) {
  auto t = parse_iso8601(text);
  TY_CHECK_T(Error, t.has_value(), who, " answered an Expiration '", text,
             "' that is not an ISO 8601 time such as 2024-05-01T12:34:56Z.");
  return *t;
}

// One request with this module's timeouts; a transport failure becomes a NetworkError that starts
// with `who` and ends with `hint`.
net::HttpResponse ask(net::HttpClient& http,
                      net::HttpRequest request,
                      const net::RetryPolicy& policy,
                      const std::string& who,
                      const std::string& hint) {
  request.connect_timeout = kConnectTimeout;
  request.timeout = kRequestTimeout;
  try {
    return http.send(request, policy);
  } catch (const net::HttpError& e) {
    throw NetworkError(detail::concat(who, ": ", e.what(), hint));
  }
}

// The JSON credentials ECS and IMDS answer: AccessKeyId, SecretAccessKey, Token, Expiration.
AwsCredentials credentials_from_json(const std::string& body,
                                     const std::string& who,
                                     const std::string& url) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(body);
  } catch (const nlohmann::json::exception&) {
    throw Error(detail::concat(who, ": ", url, " answered something that is not JSON: '",
                               net::excerpt(body), "'."));
  }
  auto field = [&](const char* key) -> std::string {
    const auto it = j.is_object() ? j.find(key) : j.end();
    return it != j.end() && it->is_string() ? it->get<std::string>() : "";
  };
  AwsCredentials c{.access_key_id = field("AccessKeyId"),
                   .secret_access_key = field("SecretAccessKey"),
                   .session_token = field("Token")};
  TY_CHECK_T(Error, !c.access_key_id.empty() && !c.secret_access_key.empty(), who, ": ", url,
             " answered no AccessKeyId and SecretAccessKey: '", net::excerpt(body), "'.");
  if (const std::string expiration = field("Expiration"); !expiration.empty())
    c.expiration = expiration_of(expiration, who + ": " + url);
  return c;
}

std::string home_file(const EnvLookup& env, const char* override_env, const char* name) {
  if (std::string path = env_value(env, override_env); !path.empty()) return path;
  const std::string home = env_value(env, "HOME");
  return home.empty() ? "" : home + "/.aws/" + name;
}

// Profile sections of an INI file: name -> key -> value. In the config file a profile's section
// is "[profile NAME]" (and "[default]"); other sections (sso-session, services) are left out.
using Profiles = std::map<std::string, std::map<std::string, std::string>>;

Profiles parse_profiles(const std::string& text, bool config_file) {
  Profiles out;
  std::map<std::string, std::string>* section = nullptr;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    // An indented line continues a nested setting ("s3 =\n  max_concurrent_requests = 4").
    const bool indented = !line.empty() && (line[0] == ' ' || line[0] == '\t');
    line = trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      std::string name = trim(line.substr(1, line.size() - 2));
      section = nullptr;
      if (config_file && name.starts_with("profile ")) {
        name = trim(name.substr(8));
      } else if (config_file && name != "default") {
        continue;
      }
      section = &out[name];
      continue;
    }
    const std::size_t eq = line.find('=');
    if (section == nullptr || indented || eq == std::string::npos) continue;
    std::string key = trim(line.substr(0, eq));
    for (char& c : key) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    (*section)[key] = trim(line.substr(eq + 1));
  }
  return out;
}

}  // namespace

AwsCredentials EnvironmentProvider::fetch() {
  AwsCredentials c{.access_key_id = env_value(env_, kAwsAccessKeyIdEnv),
                   .secret_access_key = env_value(env_, kAwsSecretAccessKeyEnv),
                   .session_token = env_value(env_, kAwsSessionTokenEnv),
                   .source = "the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"};
  if (c.access_key_id.empty() && c.secret_access_key.empty()) {
    throw InvalidArgumentError(
        "environment: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are "
        "not set.");
  }
  const char* missing = c.access_key_id.empty() ? kAwsAccessKeyIdEnv : kAwsSecretAccessKeyEnv;
  const char* present = c.access_key_id.empty() ? kAwsSecretAccessKeyEnv : kAwsAccessKeyIdEnv;
  TY_CHECK(!c.access_key_id.empty() && !c.secret_access_key.empty(), "environment: ", present,
           " is set, but ", missing,
           " is not set. HINT: set both (and AWS_SESSION_TOKEN for temporary credentials), or "
           "neither, to take credentials from a web identity token, an ~/.aws profile, the ECS "
           "task role or the EC2 instance role.");
  return c;
}

AwsCredentials ProfileProvider::fetch() {
  std::string profile = env_value(env_, kProfileEnv);
  if (profile.empty()) profile = "default";
  const std::string paths[] = {home_file(env_, kSharedCredentialsFileEnv, "credentials"),
                               home_file(env_, kConfigFileEnv, "config")};
  std::map<std::string, std::string> keys;
  std::map<std::string, std::string> key_file;  // key -> the file that set it
  std::vector<std::string> read_files;
  std::vector<std::string> names;  // the profiles there, for the error
  // The config file first, so that the credentials file's keys replace its keys.
  for (int i = 1; i >= 0; --i) {
    if (paths[i].empty()) continue;
    const auto text = read_file(paths[i]);
    if (!text) continue;
    read_files.push_back(paths[i]);
    const Profiles profiles = parse_profiles(*text, i == 1);
    for (const auto& [name, _] : profiles) names.push_back(name);
    if (auto it = profiles.find(profile); it != profiles.end()) {
      for (const auto& [k, v] : it->second) {
        keys[k] = v;
        key_file[k] = paths[i];
      }
    }
  }
  const std::string where =
      detail::concat(paths[0].empty() ? "~/.aws/credentials (no HOME)" : paths[0], " or ",
                     paths[1].empty() ? "~/.aws/config (no HOME)" : paths[1]);
  TY_CHECK(!read_files.empty(), "profile: neither ", where, " can be read (profile '", profile,
           "'). HINT: create one, or point AWS_SHARED_CREDENTIALS_FILE / AWS_CONFIG_FILE at it.");
  if (keys.empty()) {
    std::string known;
    for (const auto& n : names) known += (known.empty() ? "'" : ", '") + n + "'";
    throw InvalidArgumentError(detail::concat("profile: profile '", profile, "' is in neither ",
                                              where,
                                              " (profiles there: ", known.empty() ? "none" : known,
                                              "). HINT: set AWS_PROFILE to one of them."));
  }
  auto key = [&](const char* k) { return keys.contains(k) ? keys[k] : std::string(); };
  if (key("aws_access_key_id").empty()) {
    for (const char* kind : {"role_arn", "credential_process", "sso_session", "sso_start_url",
                             "web_identity_token_file"}) {
      TY_CHECK(!keys.contains(kind), "profile: profile '", profile, "' in ", key_file[kind],
               " uses ", kind,
               ", which trainyard does not support; it reads only aws_access_key_id, "
               "aws_secret_access_key and aws_session_token. HINT: export the credentials "
               "(`aws configure export-credentials --profile ",
               profile,
               " --format env`), or on EKS use AWS_ROLE_ARN with AWS_WEB_IDENTITY_TOKEN_FILE.");
    }
    throw InvalidArgumentError(detail::concat("profile: profile '", profile, "' in ",
                                              key_file.begin()->second,
                                              " has no aws_access_key_id."));
  }
  TY_CHECK(!key("aws_secret_access_key").empty(), "profile: profile '", profile, "' in ",
           key_file["aws_access_key_id"], " has aws_access_key_id but no aws_secret_access_key.");
  return AwsCredentials{
      .access_key_id = key("aws_access_key_id"),
      .secret_access_key = key("aws_secret_access_key"),
      .session_token = key("aws_session_token"),
      .source = detail::concat("profile '", profile, "' in ", key_file["aws_access_key_id"])};
}

AwsCredentials WebIdentityProvider::fetch() {
  const std::string token_file = env_value(env_, kWebIdentityTokenFileEnv);
  const std::string role = env_value(env_, kRoleArnEnv);
  TY_CHECK(!token_file.empty() && !role.empty(),
           "web identity: ", token_file.empty() ? kWebIdentityTokenFileEnv : kRoleArnEnv,
           " is not set.");
  const auto token = read_file(token_file);
  TY_CHECK(token.has_value() && !trim(*token).empty(), "web identity: the token file ", token_file,
           " (AWS_WEB_IDENTITY_TOKEN_FILE) cannot be read or is empty. HINT: on EKS it is the "
           "service account's projected token; check the pod's volume mounts.");
  std::string session = env_value(env_, kRoleSessionNameEnv);
  if (session.empty()) {
    session = detail::concat(
        "trainyard-",
        std::chrono::duration_cast<std::chrono::seconds>(Clock::now().time_since_epoch()).count());
  }
  std::string endpoint = env_value(env_, kStsEndpointEnv);
  if (endpoint.empty()) {
    std::string region = env_value(env_, "AWS_REGION");
    if (region.empty()) region = env_value(env_, "AWS_DEFAULT_REGION");
    if (region.empty()) region = "us-east-1";
    endpoint =
        "https://sts." + region + ".amazonaws.com" + (region.starts_with("cn-") ? ".cn" : "");
  }
  while (endpoint.ends_with('/')) endpoint.pop_back();
  const std::string who = detail::concat("web identity (STS AssumeRoleWithWebIdentity for ", role,
                                         " at ", endpoint, ")");
  const net::HttpResponse r =
      ask(http_,
          {.method = "POST",
           .url = endpoint + "/",
           .headers = {{"Content-Type", "application/x-www-form-urlencoded"}},
           .body = "Action=AssumeRoleWithWebIdentity&RoleArn=" + percent_encode(role) +
                   "&RoleSessionName=" + percent_encode(session) +
                   "&Version=2011-06-15&WebIdentityToken=" + percent_encode(trim(*token))},
          kRetry, who, " HINT: is STS reachable from here (AWS_ENDPOINT_URL_STS)?");
  if (r.status != 200) {
    const std::string code = trim(xml_text(r.body, "Code"));
    throw Error(detail::concat(
        who, " answered HTTP ", r.status, code.empty() ? "" : " " + code, ": ",
        code.empty() ? net::excerpt(r.body) : trim(xml_text(r.body, "Message")),
        code == "InvalidIdentityToken" || code == "AccessDenied"
            ? " HINT: the role's trust policy must allow this cluster's OIDC provider and service "
              "account (sts:AssumeRoleWithWebIdentity)."
            : ""));
  }
  AwsCredentials c{.access_key_id = trim(xml_text(r.body, "AccessKeyId")),
                   .secret_access_key = trim(xml_text(r.body, "SecretAccessKey")),
                   .session_token = trim(xml_text(r.body, "SessionToken")),
                   .source = "web identity (role " + role + ")"};
  TY_CHECK_T(Error, !c.access_key_id.empty() && !c.secret_access_key.empty(), who,
             " answered no AccessKeyId and SecretAccessKey: '", net::excerpt(r.body), "'.");
  if (const std::string expiration = trim(xml_text(r.body, "Expiration")); !expiration.empty())
    c.expiration = expiration_of(expiration, who);
  return c;
}

AwsCredentials EcsContainerProvider::fetch() {
  const std::string relative = env_value(env_, kEcsRelativeUriEnv);
  std::string url = env_value(env_, kEcsFullUriEnv);
  TY_CHECK(!relative.empty() || !url.empty(), "ECS container endpoint: neither ",
           kEcsRelativeUriEnv, " nor ", kEcsFullUriEnv, " is set.");
  if (!relative.empty()) {
    url = kEcsHost + relative;
  } else {
    // The token must not go in clear text to just any host (the AWS SDKs' rule).
    const bool http = url.starts_with("http://");
    const std::string_view rest = std::string_view(url).substr(http ? 7 : 0);
    const std::string_view host = rest.starts_with('[') ? rest.substr(0, rest.find(']') + 1)
                                                        : rest.substr(0, rest.find_first_of("/:"));
    const bool allowed =
        url.starts_with("https://") ||
        (http && (host.starts_with("127.") || host == "localhost" || host == "[::1]" ||
                  host == "169.254.170.2" || host == "169.254.170.23" || host == "[fd00:ec2::23]"));
    TY_CHECK(allowed, "ECS container endpoint: ", kEcsFullUriEnv, "='", url,
             "' must be https://, or http:// to a loopback address or 169.254.170.2/.23.");
  }
  net::HttpRequest request{.url = url};
  std::string token;
  if (const std::string file = env_value(env_, kEcsAuthTokenFileEnv); !file.empty()) {
    const auto text = read_file(file);
    TY_CHECK(text.has_value(), "ECS container endpoint: the token file ", file, " (",
             kEcsAuthTokenFileEnv, ") cannot be read.");
    token = trim(*text);
  } else {
    token = env_value(env_, kEcsAuthTokenEnv);
  }
  TY_CHECK(token.find_first_of("\r\n") == std::string::npos,
           "ECS container endpoint: the authorization token contains a line break.");
  if (!token.empty()) request.headers.emplace_back("Authorization", token);
  const std::string who = "ECS container endpoint";
  const net::HttpResponse r =
      ask(http_, request, kRetry, who,
          " HINT: this process runs outside the ECS task or EKS pod the variable came from?");
  TY_CHECK_T(Error, r.status == 200, who, ": GET ", url, " answered ", r.describe(),
             r.status == 401 || r.status == 403
                 ? " HINT: check AWS_CONTAINER_AUTHORIZATION_TOKEN(_FILE)."
                 : "");
  AwsCredentials c = credentials_from_json(r.body, who, url);
  c.source = "the ECS container endpoint " + url;
  return c;
}

AwsCredentials ImdsV2Provider::fetch() {
  TY_CHECK(env_value(env_, kAwsEc2MetadataDisabledEnv) != "true",
           "EC2 instance metadata: ", kAwsEc2MetadataDisabledEnv, "=true turns it off.");
  std::string endpoint = env_value(env_, kImdsEndpointEnv);
  if (endpoint.empty()) endpoint = kImdsDefaultEndpoint;
  while (endpoint.ends_with('/')) endpoint.pop_back();
  const std::string who = "EC2 instance metadata";
  // Off EC2 the token request fails or times out: one try, so the chain does not wait long.
  const std::string token_url = endpoint + "/latest/api/token";
  const net::HttpResponse t =
      ask(http_,
          {.method = "PUT",
           .url = token_url,
           .headers = {{"X-aws-ec2-metadata-token-ttl-seconds", kImdsTokenTtlSeconds}}},
          kOneTry, who,
          " HINT: not on EC2? Then give credentials another way. In a container on EC2, the "
          "instance's metadata hop limit must be 2 or more.");
  TY_CHECK_T(NetworkError, t.status == 200 && !t.body.empty(), who, ": PUT ", token_url,
             " answered ", t.describe(),
             " HINT: not on EC2? Then give credentials another way (or set ",
             kAwsEc2MetadataDisabledEnv, "=true).");
  const net::Headers auth = {{"X-aws-ec2-metadata-token", trim(t.body)}};

  const std::string roles_url = endpoint + kImdsCredentialsPath;
  net::HttpResponse r = ask(http_, {.url = roles_url, .headers = auth}, kRetry, who, "");
  TY_CHECK_T(Error, r.status != 404, who, ": GET ", roles_url,
             " answered HTTP 404: this instance has no IAM role. HINT: attach an instance "
             "profile to it.");
  TY_CHECK_T(Error, r.status == 200, who, ": GET ", roles_url, " answered ", r.describe());
  const std::string role = trim(r.body.substr(0, r.body.find('\n')));
  TY_CHECK_T(Error, !role.empty(), who, ": GET ", roles_url, " named no role.");

  const std::string url = roles_url + role;
  r = ask(http_, {.url = url, .headers = auth}, kRetry, who, "");
  TY_CHECK_T(Error, r.status == 200, who, ": GET ", url, " answered ", r.describe());
  AwsCredentials c = credentials_from_json(r.body, who, url);
  c.source = "EC2 instance metadata (role " + role + ")";
  return c;
}

ChainProvider::ChainProvider(std::vector<std::unique_ptr<AwsCredentialProvider>> providers,
                             std::vector<std::string> skipped)
    : providers_(std::move(providers)), skipped_(std::move(skipped)) {}

std::string ChainProvider::name() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_name_.empty() ? "default credential chain" : last_name_;
}

AwsCredentials ChainProvider::fetch() {
  std::vector<std::string> failures;
  for (const auto& p : providers_) {
    try {
      AwsCredentials c = p->fetch();
      if (!failures.empty()) {
        std::string before;
        for (const auto& f : failures) before += " " + f;
        logger("aws")->warn("Using AWS credentials from {}, after these failed:{}", c.source,
                            before);
      }
      std::lock_guard<std::mutex> lock(mu_);
      last_name_ = p->name();
      return c;
    } catch (const std::exception& e) {
      failures.emplace_back(e.what());
    }
  }
  std::string msg = "No AWS credentials found.";
  for (const auto& f : failures) msg += " Tried " + f;
  for (const auto& s : skipped_) msg += " Skipped " + s;
  msg +=
      " HINT: export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, set AWS_PROFILE to a profile "
      "with keys, or run where a role is given (EKS service account, ECS task role, EC2 instance "
      "profile).";
  throw InvalidArgumentError(msg);
}

std::unique_ptr<ChainProvider> default_credential_chain(const EnvLookup& env) {
  auto set = [&](const char* name) { return !env_value(env, name).empty(); };
  std::vector<std::unique_ptr<AwsCredentialProvider>> providers;
  std::vector<std::string> skipped;
  if (set(kAwsAccessKeyIdEnv) || set(kAwsSecretAccessKeyEnv)) {
    providers.push_back(std::make_unique<EnvironmentProvider>(env));
  } else {
    skipped.emplace_back("environment: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set.");
  }
  if (set(kWebIdentityTokenFileEnv) && set(kRoleArnEnv)) {
    providers.push_back(std::make_unique<WebIdentityProvider>(env));
  } else {
    skipped.emplace_back(
        "web identity: AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN are not both "
        "set.");
  }
  const std::string credentials = home_file(env, kSharedCredentialsFileEnv, "credentials");
  const std::string config = home_file(env, kConfigFileEnv, "config");
  std::error_code ec;
  if (set(kProfileEnv) || (!credentials.empty() && std::filesystem::exists(credentials, ec)) ||
      (!config.empty() && std::filesystem::exists(config, ec))) {
    providers.push_back(std::make_unique<ProfileProvider>(env));
  } else {
    skipped.push_back(detail::concat("profile: AWS_PROFILE is not set and neither ",
                                     credentials.empty() ? "~/.aws/credentials" : credentials,
                                     " nor ", config.empty() ? "~/.aws/config" : config,
                                     " exists."));
  }
  if (set(kEcsRelativeUriEnv) || set(kEcsFullUriEnv)) {
    providers.push_back(std::make_unique<EcsContainerProvider>(env));
  } else {
    skipped.emplace_back(
        "ECS container endpoint: AWS_CONTAINER_CREDENTIALS_RELATIVE_URI and "
        "_FULL_URI are not set.");
  }
  if (env_value(env, kAwsEc2MetadataDisabledEnv) != "true") {
    providers.push_back(std::make_unique<ImdsV2Provider>(env));
  } else {
    skipped.emplace_back("EC2 instance metadata: AWS_EC2_METADATA_DISABLED=true.");
  }
  return std::make_unique<ChainProvider>(std::move(providers), std::move(skipped));
}

CachingProvider::CachingProvider(std::unique_ptr<AwsCredentialProvider> inner,
                                 CachingOptions options)
    : inner_(std::move(inner)), options_(std::move(options)) {
  TY_CHECK(inner_ != nullptr, "CachingProvider needs a provider to cache.");
  TY_CHECK(options_.refresh_margin.count() >= 0 && options_.retry_interval.count() >= 0,
           "CachingOptions.refresh_margin = ", options_.refresh_margin.count(),
           " s and retry_interval = ", options_.retry_interval.count(), " s must not be negative.");
}

// Note [Credential refresh]
// Temporary credentials (web identity, ECS, IMDS) last an hour or more; they are replaced once
// less than refresh_margin remains, so a request signed with them (and its retries, about
// S3Config.retry_deadline) does not outlive them. An endpoint that fails then is not fatal: the
// old credentials serve until they expire, and the endpoint is asked again at most every
// retry_interval, so a failing one does not slow every request down.
AwsCredentials CachingProvider::fetch() {
  std::lock_guard<std::mutex> lock(mu_);
  const Clock::time_point now = options_.now ? options_.now() : Clock::now();
  if (cached_) {
    if (!cached_->expiration || now < *cached_->expiration - options_.refresh_margin)
      return *cached_;
    if (now < *cached_->expiration && now < next_attempt_) return *cached_;
  }
  next_attempt_ = now + options_.retry_interval;
  try {
    AwsCredentials fresh = inner_->fetch();
    auto log = logger("aws");
    if (fresh.expiration) {
      log->info("AWS credentials from {}, valid for {} more minutes.", fresh.source,
                std::chrono::duration_cast<std::chrono::minutes>(*fresh.expiration - now).count());
    } else if (!cached_) {
      log->info("AWS credentials from {}.", fresh.source);
    }
    cached_ = std::move(fresh);
    return *cached_;
  } catch (const std::exception& e) {
    if (!cached_ || !cached_->expiration || now >= *cached_->expiration) throw;
    logger("aws")->warn(
        "Could not refresh the AWS credentials from {}; using the old ones, valid for {} more "
        "s, and trying again in {} s: {}",
        cached_->source,
        std::chrono::duration_cast<std::chrono::seconds>(*cached_->expiration - now).count(),
        options_.retry_interval.count(), e.what());
    return *cached_;
  }
}

}  // namespace trainyard::storage
