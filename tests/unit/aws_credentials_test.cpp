// AWS credential providers against local stand-ins (cpp-httplib on 127.0.0.1, port 0) for the ECS
// container endpoint, STS and IMDSv2; ~/.aws profile files in a temp dir; the default chain's
// order and its combined error; CachingProvider's refresh under a test clock; and S3 requests
// signed with the refreshed credentials.
#include "trainyard/storage/aws_credentials.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../closed_port.h"
#include "../temp_dir.h"
#include "../text.h"
#include "trainyard/error.h"
#include "trainyard/storage/s3_storage.h"

namespace trainyard::storage {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::system_clock;
using Env = std::map<std::string, std::string>;

EnvLookup env_of(Env vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// A server on 127.0.0.1 with a free port, serving on a thread until the test ends.
class TestServer {
 public:
  TestServer() {
    port_ = server_.bind_to_any_port("127.0.0.1");
    EXPECT_GT(port_, 0);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~TestServer() {
    server_.stop();
    thread_.join();
  }
  httplib::Server* operator->() { return &server_; }
  std::string url(const std::string& path = "") const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

using trainyard::test::closed_port;

// The shared TempDir that also writes files into itself.
class TempDir : public trainyard::test::TempDir {
 public:
  TempDir() : trainyard::test::TempDir("aws_creds") {}
  std::string write(const std::string& name, const std::string& text) const {
    const auto p = path() / name;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }
};

template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "an exception of another type: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

using trainyard::test::contains;

constexpr const char* kJsonCredentials =
    R"({"Code": "Success", "AccessKeyId": "ASIAJSON", "SecretAccessKey": "json-secret",
        "Token": "json-token", "Expiration": "2031-02-03T04:05:06Z"})";

Clock::time_point expected_expiration() {
  using namespace std::chrono;
  return sys_days(year(2031) / 2 / 3) + 4h + 5min + 6s;
}

// ---- environment and profiles ------------------------------------------------------------------

TEST(EnvironmentProvider, ReadsKeysAndNamesTheMissingOne) {
  auto c = EnvironmentProvider(env_of({{"AWS_ACCESS_KEY_ID", "AKIA"},
                                       {"AWS_SECRET_ACCESS_KEY", "s"},
                                       {"AWS_SESSION_TOKEN", "t"}}))
               .fetch();
  EXPECT_EQ(c.access_key_id, "AKIA");
  EXPECT_EQ(c.secret_access_key, "s");
  EXPECT_EQ(c.session_token, "t");
  EXPECT_FALSE(c.expiration.has_value());
  const std::string msg = error_of<InvalidArgumentError>([] {
    EnvironmentProvider(env_of({{"AWS_ACCESS_KEY_ID", "AKIA"}})).fetch();
  });
  EXPECT_TRUE(contains(msg, "AWS_SECRET_ACCESS_KEY is not set")) << msg;
}

TEST(ProfileProvider, ReadsDefaultNamedAndConfigProfiles) {
  TempDir home;
  const std::string credentials = home.write(".aws/credentials",
                                             "# keys\n"
                                             "[default]\n"
                                             "aws_access_key_id = AKIADEFAULT\n"
                                             "aws_secret_access_key=default-secret\n"
                                             "\n"
                                             "[dev]\n"
                                             "aws_access_key_id = AKIADEV\n"
                                             "aws_secret_access_key = dev-secret\n"
                                             "aws_session_token = dev-token\n"
                                             "[both]\n"
                                             "aws_access_key_id = AKIAFROMCREDENTIALS\n");
  const std::string config = home.write(".aws/config",
                                        "[default]\n"
                                        "region = eu-west-1\n"
                                        "[profile cfg]\n"
                                        "aws_access_key_id = AKIACFG\n"
                                        "aws_secret_access_key = cfg-secret\n"
                                        "s3 =\n"
                                        "  aws_access_key_id = NESTED\n"
                                        "[profile both]\n"
                                        "aws_access_key_id = AKIAFROMCONFIG\n"
                                        "aws_secret_access_key = config-secret\n"
                                        "[sso-session corp]\n"
                                        "aws_access_key_id = NOT-A-PROFILE\n");
  Env env = {{"HOME", home.str()}};
  auto c = ProfileProvider(env_of(env)).fetch();
  EXPECT_EQ(c.access_key_id, "AKIADEFAULT");
  EXPECT_EQ(c.secret_access_key, "default-secret");
  EXPECT_EQ(c.session_token, "");
  EXPECT_TRUE(contains(c.source, "profile 'default' in " + credentials)) << c.source;

  env["AWS_PROFILE"] = "dev";
  c = ProfileProvider(env_of(env)).fetch();
  EXPECT_EQ(c.access_key_id, "AKIADEV");
  EXPECT_EQ(c.session_token, "dev-token");

  env["AWS_PROFILE"] = "cfg";
  c = ProfileProvider(env_of(env)).fetch();
  EXPECT_EQ(c.access_key_id, "AKIACFG") << "a nested setting is not the profile's key";
  EXPECT_TRUE(contains(c.source, config)) << c.source;

  env["AWS_PROFILE"] = "both";
  c = ProfileProvider(env_of(env)).fetch();
  EXPECT_EQ(c.access_key_id, "AKIAFROMCREDENTIALS") << "the credentials file wins";
  EXPECT_EQ(c.secret_access_key, "config-secret");

  env["AWS_PROFILE"] = "corp";
  std::string msg = error_of<InvalidArgumentError>([&] { ProfileProvider(env_of(env)).fetch(); });
  EXPECT_TRUE(contains(msg, "profile 'corp' is in neither")) << msg;
  EXPECT_TRUE(contains(msg, "'dev'")) << msg;

  // The files named by variables instead of HOME.
  TempDir other;
  const std::string path = other.write("creds", "[default]\naws_access_key_id = AKIAOTHER\n");
  msg = error_of<InvalidArgumentError>([&] {
    ProfileProvider(env_of({{"AWS_SHARED_CREDENTIALS_FILE", path}})).fetch();
  });
  EXPECT_TRUE(contains(msg, "has aws_access_key_id but no aws_secret_access_key")) << msg;
  EXPECT_TRUE(contains(msg, path)) << msg;
}

TEST(ProfileProvider, SaysWhatItDoesNotSupport) {
  TempDir home;
  home.write(".aws/config",
             "[profile ml]\nrole_arn = arn:aws:iam::1:role/ml\nsource_profile = default\n"
             "[profile empty]\nregion = us-east-1\n");
  Env env = {{"HOME", home.str()}, {"AWS_PROFILE", "ml"}};
  std::string msg = error_of<InvalidArgumentError>([&] { ProfileProvider(env_of(env)).fetch(); });
  EXPECT_TRUE(contains(msg, "profile 'ml'")) << msg;
  EXPECT_TRUE(contains(msg, "uses role_arn, which trainyard does not support")) << msg;
  env["AWS_PROFILE"] = "empty";
  msg = error_of<InvalidArgumentError>([&] { ProfileProvider(env_of(env)).fetch(); });
  EXPECT_TRUE(contains(msg, "has no aws_access_key_id")) << msg;
  msg = error_of<InvalidArgumentError>([&] {
    ProfileProvider(env_of({{"HOME", home.str() + "/nowhere"}})).fetch();
  });
  EXPECT_TRUE(contains(msg, "can be read")) << msg;
}

// ---- ECS, STS and IMDS stand-ins ---------------------------------------------------------------

TEST(EcsContainerProvider, SendsTheAuthorizationTokenAndReadsTheJson) {
  TestServer ecs;
  std::atomic<int> calls{0};
  ecs->Get("/creds", [&](const httplib::Request& req, httplib::Response& res) {
    ++calls;
    if (req.get_header_value("Authorization") != "Bearer pod-token") {
      res.status = 401;
      res.set_content("bad token", "text/plain");
      return;
    }
    res.set_content(kJsonCredentials, "application/json");
  });
  TempDir dir;
  const std::string token_file = dir.write("token", "Bearer pod-token\n");
  Env env = {{"AWS_CONTAINER_CREDENTIALS_FULL_URI", ecs.url("/creds")},
             {"AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", token_file}};
  auto c = EcsContainerProvider(env_of(env)).fetch();
  EXPECT_EQ(c.access_key_id, "ASIAJSON");
  EXPECT_EQ(c.secret_access_key, "json-secret");
  EXPECT_EQ(c.session_token, "json-token");
  EXPECT_EQ(c.expiration, expected_expiration());

  env.erase("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
  env["AWS_CONTAINER_AUTHORIZATION_TOKEN"] = "Bearer wrong";
  std::string msg = error_of<Error>([&] { EcsContainerProvider(env_of(env)).fetch(); });
  EXPECT_TRUE(contains(msg, "ECS container endpoint")) << msg;
  EXPECT_TRUE(contains(msg, "HTTP 401")) << msg;
  EXPECT_TRUE(contains(msg, "AWS_CONTAINER_AUTHORIZATION_TOKEN")) << msg;

  msg = error_of<InvalidArgumentError>([] {
    EcsContainerProvider(env_of({{"AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://example.com/c"}}))
        .fetch();
  });
  EXPECT_TRUE(contains(msg, "must be https://")) << msg;
}

TEST(WebIdentityProvider, ExchangesTheTokenFileAtSts) {
  TestServer sts;
  std::mutex mu;
  std::map<std::string, std::string> seen;
  sts->Post("/", [&](const httplib::Request& req, httplib::Response& res) {
    {
      std::lock_guard<std::mutex> lock(mu);
      for (const char* k :
           {"Action", "RoleArn", "RoleSessionName", "WebIdentityToken", "Version"}) {
        seen[k] = req.get_param_value(k);
      }
    }
    if (req.get_param_value("WebIdentityToken") != "eyJ.jwt+/=") {
      res.status = 400;
      res.set_content(
          "<ErrorResponse><Error><Type>Sender</Type><Code>InvalidIdentityToken</Code>"
          "<Message>Incorrect token audience</Message></Error></ErrorResponse>",
          "text/xml");
      return;
    }
    res.set_content(
        "<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult><Credentials>\n"
        "  <AccessKeyId>ASIASTS</AccessKeyId>\n"
        "  <SecretAccessKey>sts-secret</SecretAccessKey>\n"
        "  <SessionToken>sts-token</SessionToken>\n"
        "  <Expiration>2031-02-03T04:05:06.123Z</Expiration>\n"
        "</Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>",
        "text/xml");
  });
  TempDir dir;
  Env env = {{"AWS_WEB_IDENTITY_TOKEN_FILE", dir.write("token", "eyJ.jwt+/=\n")},
             {"AWS_ROLE_ARN", "arn:aws:iam::123:role/train"},
             {"AWS_ROLE_SESSION_NAME", "job-7"},
             {"AWS_ENDPOINT_URL_STS", sts.url("/")}};
  auto c = WebIdentityProvider(env_of(env)).fetch();
  EXPECT_EQ(c.access_key_id, "ASIASTS");
  EXPECT_EQ(c.secret_access_key, "sts-secret");
  EXPECT_EQ(c.session_token, "sts-token");
  EXPECT_EQ(c.expiration, expected_expiration());
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(seen["Action"], "AssumeRoleWithWebIdentity");
    EXPECT_EQ(seen["RoleArn"], "arn:aws:iam::123:role/train");
    EXPECT_EQ(seen["RoleSessionName"], "job-7");
    EXPECT_EQ(seen["WebIdentityToken"], "eyJ.jwt+/=");
    EXPECT_EQ(seen["Version"], "2011-06-15");
  }

  dir.write("token", "rotated");  // read again on every fetch
  const std::string msg = error_of<Error>([&] { WebIdentityProvider(env_of(env)).fetch(); });
  EXPECT_TRUE(contains(msg, "HTTP 400 InvalidIdentityToken: Incorrect token audience")) << msg;
  EXPECT_TRUE(contains(msg, "arn:aws:iam::123:role/train")) << msg;
  EXPECT_TRUE(contains(msg, "trust policy")) << msg;
}

// IMDSv2: a token from PUT /latest/api/token, required on every GET.
class ImdsStandIn {
 public:
  ImdsStandIn() {
    server_->Put("/latest/api/token", [this](const httplib::Request& req, httplib::Response& res) {
      ++puts;
      if (!req.has_header("X-aws-ec2-metadata-token-ttl-seconds")) {
        res.status = 400;
        return;
      }
      res.set_content("imds-session", "text/plain");
    });
    server_->Get(R"(/latest/meta-data/iam/security-credentials/(.*))",
                 [this](const httplib::Request& req, httplib::Response& res) {
                   if (req.get_header_value("X-aws-ec2-metadata-token") != "imds-session") {
                     res.status = 401;
                     return;
                   }
                   if (req.matches[1] == "") {
                     res.set_content("trainer-role\n", "text/plain");
                   } else if (req.matches[1] == "trainer-role") {
                     res.set_content(kJsonCredentials, "application/json");
                   } else {
                     res.status = 404;
                   }
                 });
  }
  std::string url() const { return server_.url(); }
  std::atomic<int> puts{0};

 private:
  TestServer server_;
};

TEST(ImdsV2Provider, UsesTheSessionTokenForTheRoleAndItsCredentials) {
  ImdsStandIn imds;
  // The stand-in refuses a GET without the token.
  net::HttpClient http;
  EXPECT_EQ(
      http.perform({.url = imds.url() + "/latest/meta-data/iam/security-credentials/"}).status,
      401);

  const Env env = {{"AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.url() + "/"}};
  auto c = ImdsV2Provider(env_of(env)).fetch();
  EXPECT_EQ(c.access_key_id, "ASIAJSON");
  EXPECT_EQ(c.session_token, "json-token");
  EXPECT_EQ(c.expiration, expected_expiration());
  EXPECT_TRUE(contains(c.source, "trainer-role")) << c.source;
  EXPECT_EQ(imds.puts, 1);

  const auto start = std::chrono::steady_clock::now();
  const std::string msg = error_of<NetworkError>([] {
    ImdsV2Provider(env_of({{"AWS_EC2_METADATA_SERVICE_ENDPOINT",
                            "http://127.0.0.1:" + std::to_string(closed_port())}}))
        .fetch();
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s) << "one try, off EC2";
  EXPECT_TRUE(contains(msg, "EC2 instance metadata")) << msg;
  EXPECT_TRUE(contains(msg, "HINT: not on EC2?")) << msg;
}

// ---- the chain ---------------------------------------------------------------------------------

TEST(DefaultCredentialChain, FollowsTheSdkOrder) {
  TestServer ecs;
  ecs->Get("/creds", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(
        R"({"AccessKeyId": "ASIAECS", "SecretAccessKey": "s", "Token": "t",
            "Expiration": "2031-02-03T04:05:06Z"})",
        "application/json");
  });
  ImdsStandIn imds;
  TestServer sts;
  sts->Post("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(
        "<Credentials><AccessKeyId>ASIASTS</AccessKeyId><SecretAccessKey>s"
        "</SecretAccessKey><SessionToken>t</SessionToken></Credentials>",
        "text/xml");
  });
  TempDir home;
  home.write(".aws/credentials",
             "[default]\naws_access_key_id = AKIAPROFILE\n"
             "aws_secret_access_key = s\n");
  Env env = {{"AWS_ACCESS_KEY_ID", "AKIAENV"},
             {"AWS_SECRET_ACCESS_KEY", "s"},
             {"AWS_WEB_IDENTITY_TOKEN_FILE", home.write("token", "jwt")},
             {"AWS_ROLE_ARN", "arn:aws:iam::1:role/r"},
             {"AWS_ENDPOINT_URL_STS", sts.url()},
             {"HOME", home.str()},
             {"AWS_CONTAINER_CREDENTIALS_FULL_URI", ecs.url("/creds")},
             {"AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.url()}};
  auto next = [&](const char* expected_key, const char* expected_name) {
    auto chain = default_credential_chain(env_of(env));
    EXPECT_EQ(chain->fetch().access_key_id, expected_key);
    EXPECT_EQ(chain->name(), expected_name);
  };
  next("AKIAENV", "environment");
  env.erase("AWS_ACCESS_KEY_ID");
  env.erase("AWS_SECRET_ACCESS_KEY");
  next("ASIASTS", "web identity");
  env.erase("AWS_ROLE_ARN");
  next("AKIAPROFILE", "profile");
  env["HOME"] = home.str() + "/nowhere";
  next("ASIAECS", "ECS container endpoint");
  EXPECT_EQ(imds.puts, 0) << "IMDS is last";
  // A configured provider that fails is passed over.
  env["AWS_CONTAINER_CREDENTIALS_FULL_URI"] = "http://127.0.0.1:" + std::to_string(closed_port());
  next("ASIAJSON", "EC2 instance metadata");
  EXPECT_EQ(imds.puts, 1);
}

TEST(DefaultCredentialChain, ListsEveryProviderWhenNoneGivesCredentials) {
  TempDir home;
  const std::string home_path = home.str();
  const Env env = {
      {"HOME", home_path},
      {"AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:" + std::to_string(closed_port())}};
  const std::string msg =
      error_of<InvalidArgumentError>([&] { default_credential_chain(env_of(env))->fetch(); });
  for (const char* part :
       {"No AWS credentials found.", "Skipped environment: AWS_ACCESS_KEY_ID",
        "Skipped web identity: AWS_WEB_IDENTITY_TOKEN_FILE", "Skipped profile: AWS_PROFILE",
        home_path.c_str(), "Skipped ECS container endpoint",
        "Tried EC2 instance metadata: ", "HINT: "}) {
    EXPECT_TRUE(contains(msg, part)) << part << " in: " << msg;
  }
  const std::string off = error_of<InvalidArgumentError>([&] {
    default_credential_chain(env_of({{"HOME", home.str()}, {"AWS_EC2_METADATA_DISABLED", "true"}}))
        ->fetch();
  });
  EXPECT_TRUE(contains(off, "Skipped EC2 instance metadata: AWS_EC2_METADATA_DISABLED=true"))
      << off;
}

// ---- caching -----------------------------------------------------------------------------------

// Hands out "AKIA1", "AKIA2", ... each valid for `lifetime` from the test clock, or fails.
class CountingProvider final : public AwsCredentialProvider {
 public:
  CountingProvider(std::shared_ptr<std::atomic<int>> calls,
                   std::shared_ptr<std::atomic<bool>> failing,
                   const Clock::time_point* now,  // the test's clock; outlives this
                   std::chrono::minutes lifetime)
      : calls_(std::move(calls)), failing_(std::move(failing)), now_(now), lifetime_(lifetime) {}
  AwsCredentials fetch() override {
    const int n = ++*calls_;
    if (*failing_) throw NetworkError("counting: the endpoint is down.");
    std::this_thread::sleep_for(5ms);  // lets concurrent callers pile up
    return {.access_key_id = "AKIA" + std::to_string(n),
            .secret_access_key = "s",
            .expiration = *now_ + lifetime_,
            .source = "counting"};
  }
  std::string name() const override { return "counting"; }

 private:
  std::shared_ptr<std::atomic<int>> calls_;
  std::shared_ptr<std::atomic<bool>> failing_;
  const Clock::time_point* now_;
  std::chrono::minutes lifetime_;
};

struct CachingFixture {
  Clock::time_point now = Clock::now();
  std::shared_ptr<std::atomic<int>> calls = std::make_shared<std::atomic<int>>(0);
  std::shared_ptr<std::atomic<bool>> failing = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<CachingProvider> make(std::chrono::minutes lifetime = 60min) {
    return std::make_shared<CachingProvider>(
        std::make_unique<CountingProvider>(calls, failing, &now, lifetime),
        CachingOptions{.now = [this] { return now; }});
  }
};

TEST(CachingProvider, RefreshesWithinFiveMinutesOfExpiry) {
  CachingFixture f;
  auto p = f.make();
  EXPECT_EQ(p->fetch().access_key_id, "AKIA1");
  f.now += 54min;  // 6 minutes left
  EXPECT_EQ(p->fetch().access_key_id, "AKIA1");
  EXPECT_EQ(*f.calls, 1);
  f.now += 2min;  // 4 minutes left
  EXPECT_EQ(p->fetch().access_key_id, "AKIA2");
  EXPECT_EQ(p->fetch().access_key_id, "AKIA2");
  EXPECT_EQ(*f.calls, 2);
}

TEST(CachingProvider, ServesTheOldCredentialsWhileARefreshFails) {
  CachingFixture f;
  auto p = f.make();
  EXPECT_EQ(p->fetch().access_key_id, "AKIA1");
  *f.failing = true;
  f.now += 58min;  // 2 minutes left
  EXPECT_EQ(p->fetch().access_key_id, "AKIA1");
  EXPECT_EQ(*f.calls, 2);
  EXPECT_EQ(p->fetch().access_key_id, "AKIA1");
  EXPECT_EQ(*f.calls, 2) << "no new attempt within retry_interval";
  f.now += 11s;
  EXPECT_EQ(p->fetch().access_key_id, "AKIA1");
  EXPECT_EQ(*f.calls, 3);
  f.now += 2min;  // expired
  const std::string msg = error_of<NetworkError>([&] { p->fetch(); });
  EXPECT_TRUE(contains(msg, "the endpoint is down")) << msg;
  *f.failing = false;
  EXPECT_EQ(p->fetch().access_key_id, "AKIA5");
}

TEST(CachingProvider, OneRefreshForConcurrentCallers) {
  CachingFixture f;
  auto p = f.make();
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] { EXPECT_EQ(p->fetch().access_key_id, "AKIA1"); });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(*f.calls, 1);
}

// ---- S3 requests take the current credentials --------------------------------------------------

TEST(S3Credentials, EveryRequestIsSignedWithTheCurrentCredentials) {
  TestServer s3;
  std::mutex mu;
  std::vector<std::string> seen;  // "<access key id> <security token>" per request
  s3->Put(R"(/.*)", [&](const httplib::Request& req, httplib::Response& res) {
    const std::string auth = req.get_header_value("Authorization");
    const std::size_t at = auth.find("Credential=");
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back(auth.substr(at + 11, auth.find('/', at) - at - 11) + " " +
                   req.get_header_value("x-amz-security-token"));
    res.set_header("ETag", "\"e\"");
  });
  CachingFixture f;
  auto storage = make_s3_storage(
      S3Config{.bucket = "b", .endpoint = s3.url(), .credentials = f.make(), .retry_deadline = 0s});
  storage->write("a", "1");
  storage->write("b", "2");
  f.now += 57min;
  storage->write("c", "3");
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(seen, (std::vector<std::string>{"AKIA1 ", "AKIA1 ", "AKIA2 "}));
}

TEST(S3Credentials, FromUriUsesTheChainWithoutKeysInTheEnvironment) {
  TestServer ecs;
  ecs->Get("/creds", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(kJsonCredentials, "application/json");
  });
  TempDir home;
  auto c = S3Config::from_uri(
      "s3://bucket/p",
      env_of({{"HOME", home.str()}, {"AWS_CONTAINER_CREDENTIALS_FULL_URI", ecs.url("/creds")}}));
  ASSERT_NE(c.credentials, nullptr);
  EXPECT_EQ(c.access_key_id, "");
  EXPECT_EQ(c.credentials->fetch().access_key_id, "ASIAJSON");
  EXPECT_EQ(c.credentials->name(), "ECS container endpoint");

  const std::string msg = error_of<InvalidArgumentError>([&] {
    S3Config::from_uri("s3://bucket/p",
                       env_of({{"HOME", home.str()}, {"AWS_EC2_METADATA_DISABLED", "true"}}));
  });
  EXPECT_TRUE(contains(msg, "S3 storage s3://bucket/p: No AWS credentials found.")) << msg;
}

}  // namespace
}  // namespace trainyard::storage
