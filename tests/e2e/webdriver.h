// A small W3C WebDriver client for browser tests: starts Debian's chromedriver on a free port,
// opens one headless chromium session and drives it (navigate, execute a script, screenshot)
// over HTTP with trainyard's net::HttpClient. Every wait is bounded; the destructor deletes the
// session and stops chromedriver (its process group: the browser too).
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "trainyard/error.h"
#include "trainyard/net/http_client.h"

namespace trainyard::test {

struct WebDriverOptions {
  std::string chromedriver = "/usr/bin/chromedriver";
  std::string chromium = "/usr/bin/chromium";
  std::filesystem::path work_dir;  // the browser's profile and chromedriver's log; required
  std::chrono::milliseconds start_timeout{30'000};  // chromedriver ready and the session open
  int window_width = 1400;
  int window_height = 2200;
};

class WebDriver {
 public:
  explicit WebDriver(WebDriverOptions o) : o_(std::move(o)) {
    port_ = free_port();
    log_ = o_.work_dir / "chromedriver.log";
    const std::string port_arg = "--port=" + std::to_string(port_);  // no allocation after fork()
    pid_ = ::fork();
    TY_CHECK(pid_ >= 0, "fork() for chromedriver failed.");
    if (pid_ == 0) {
      ::setpgid(0, 0);  // its own group: the browser it starts is stopped with it
      int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      ::execl(o_.chromedriver.c_str(), o_.chromedriver.c_str(), port_arg.c_str(), (char*)nullptr);
      ::_exit(127);
    }
    ::setpgid(pid_, pid_);
    const auto deadline = std::chrono::steady_clock::now() + o_.start_timeout;
    for (;;) {
      try {
        auto r = http_.perform(request("GET", "/status", ""));
        if (r.status == 200 && nlohmann::json::parse(r.body)["value"].value("ready", false)) break;
      } catch (const std::exception&) {
      }
      if (std::chrono::steady_clock::now() > deadline) {
        stop();
        throw TimeoutError("chromedriver did not get ready on port " + std::to_string(port_) +
                           " within " + std::to_string(o_.start_timeout.count()) + " ms; see " +
                           log_.string() + ".");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    nlohmann::json args = {"--headless=new",
                           "--no-sandbox",
                           "--disable-gpu",
                           "--disable-dev-shm-usage",
                           "--no-first-run",
                           "--user-data-dir=" + (o_.work_dir / "profile").string(),
                           "--window-size=" + std::to_string(o_.window_width) + "," +
                               std::to_string(o_.window_height)};
    nlohmann::json caps = {
        {"capabilities",
         {{"alwaysMatch",
           {{"browserName", "chrome"},
            {"goog:chromeOptions", {{"binary", o_.chromium}, {"args", args}}}}}}}};
    try {
      session_ = call("POST", "/session", caps).value("sessionId", "");
    } catch (...) {
      stop();
      throw;
    }
  }

  ~WebDriver() { stop(); }
  WebDriver(const WebDriver&) = delete;
  WebDriver& operator=(const WebDriver&) = delete;

  void navigate(const std::string& url) { call("POST", session_path("/url"), {{"url", url}}); }

  // Runs `script` (a function body; `arguments` holds args) in the page; returns its value.
  nlohmann::json execute(const std::string& script, nlohmann::json args = nlohmann::json::array()) {
    return call("POST", session_path("/execute/sync"), {{"script", script}, {"args", args}});
  }

  // The viewport as PNG bytes.
  std::string screenshot_png() {
    return base64_decode(call("GET", session_path("/screenshot"), nullptr).get<std::string>());
  }

  const std::filesystem::path& log_path() const { return log_; }

 private:
  static int free_port() {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof(a);
    TY_CHECK(fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                 ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0,
             "Could not find a free port on 127.0.0.1 for chromedriver.");
    ::close(fd);
    return ntohs(a.sin_port);
  }

  std::string session_path(const std::string& rest) const { return "/session/" + session_ + rest; }

  net::HttpRequest request(const std::string& method, const std::string& path, std::string body) {
    net::HttpRequest r;
    r.method = method;
    r.url = "http://127.0.0.1:" + std::to_string(port_) + path;
    r.body = std::move(body);
    if (!r.body.empty()) r.headers.push_back({"Content-Type", "application/json; charset=utf-8"});
    r.connect_timeout = std::chrono::milliseconds(2'000);
    r.timeout = o_.start_timeout;
    return r;
  }

  // One WebDriver command: its "value", or Error with the driver's error and message.
  nlohmann::json call(const std::string& method,
                      const std::string& path,
                      const nlohmann::json& body) {
    auto r = http_.perform(request(method, path, body.is_null() ? "" : body.dump()));
    auto j = nlohmann::json::parse(r.body, nullptr, /*allow_exceptions=*/false);
    if (r.status != 200 || j.is_discarded()) {
      std::string what =
          j.is_discarded() ? net::excerpt(r.body)
                           : j["value"].value("error", "") + ": " + j["value"].value("message", "");
      throw Error("WebDriver " + method + " " + path + " answered HTTP " +
                  std::to_string(r.status) + ": " + what +
                  " (chromedriver's log: " + log_.string() + ").");
    }
    return j["value"];
  }

  void stop() {
    if (!session_.empty()) {
      try {
        net::HttpRequest r = request("DELETE", "/session/" + session_, "");
        r.timeout = std::chrono::milliseconds(10'000);
        http_.perform(r);
      } catch (const std::exception&) {
      }
      session_.clear();
    }
    if (pid_ > 0) {
      ::kill(-pid_, SIGTERM);
      for (int i = 0; i < 100; ++i) {  // 5 s
        if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
          pid_ = -1;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (pid_ > 0) {
        ::kill(-pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        pid_ = -1;
      }
    }
  }

  static std::string base64_decode(const std::string& in) {
    auto value = [](char c) -> int {
      if (c >= 'A' && c <= 'Z') return c - 'A';
      if (c >= 'a' && c <= 'z') return c - 'a' + 26;
      if (c >= '0' && c <= '9') return c - '0' + 52;
      if (c == '+') return 62;
      if (c == '/') return 63;
      return -1;
    };
    std::string out;
    int bits = 0, acc = 0;
    for (char c : in) {
      int v = value(c);
      if (v < 0) continue;  // '=' padding and line breaks
      acc = ((acc << 6) | v) & 0xffffff;
      bits += 6;
      if (bits >= 8) {
        bits -= 8;
        out.push_back(static_cast<char>((acc >> bits) & 0xff));
      }
    }
    return out;
  }

  WebDriverOptions o_;
  net::HttpClient http_;
  int port_ = 0;
  pid_t pid_ = -1;
  std::filesystem::path log_;
  std::string session_;
};

}  // namespace trainyard::test
