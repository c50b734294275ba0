// Helpers for the cluster tests: a blocking libcurl HTTP call, a temporary directory and a bounded
// poll. Real HTTP on 127.0.0.1.
#pragma once

#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "../temp_dir.h"

namespace trainyard::test {

struct HttpResult {
  long status = 0;
  std::string body;
  nlohmann::json json() const {
    return nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  }
};

inline size_t curl_append(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

// One request; status 0 when the server could not be reached.
inline HttpResult http(const std::string& method,
                       const std::string& url,
                       const std::string& body = "",
                       const std::map<std::string, std::string>& headers = {}) {
  HttpResult r;
  CURL* c = curl_easy_init();
  curl_slist* list = nullptr;
  for (const auto& [k, v] : headers) list = curl_slist_append(list, (k + ": " + v).c_str());
  if (!body.empty() && !headers.count("Content-Type")) {
    list = curl_slist_append(list, "Content-Type: application/json");
  }
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method.c_str());
  if (method == "POST" || !body.empty()) {
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  }
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &curl_append);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &r.body);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 10'000L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
  curl_slist_free_all(list);
  curl_easy_cleanup(c);
  return r;
}

// Polls cond every 20 ms until it holds or `timeout` passes; returns whether it held.
inline bool eventually(const std::function<bool()>& cond,
                       std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return cond();
}

// Runs a WebSocket client (Python's aiohttp, as Ray's CLI uses) against url for at most
// timeout_s seconds: returns the text frames it received, then "<closed>" if the server closed.
inline std::string websocket_read_all(const std::string& url,
                                      const std::string& auth_header = "",
                                      int timeout_s = 15) {
  std::string script =
      "import asyncio, sys, aiohttp\n"
      "async def main():\n"
      "    h = {'Authorization': sys.argv[2]} if sys.argv[2] else {}\n"
      "    async with aiohttp.ClientSession() as s:\n"
      "        try:\n"
      "            ws = await s.ws_connect(sys.argv[1], headers=h)\n"
      "        except aiohttp.WSServerHandshakeError as e:\n"
      "            print('<refused %d>' % e.status); return\n"
      "        async for m in ws:\n"
      "            if m.type == aiohttp.WSMsgType.TEXT: sys.stdout.write(m.data); "
      "sys.stdout.flush()\n"
      "        print('<closed>')\n"
      "asyncio.run(main())\n";
  TempDir dir;
  std::filesystem::path path = dir.path() / "ws_read.py";
  {
    FILE* f = fopen(path.c_str(), "w");
    if (!f) return "<cannot write the client script>";
    fputs(script.c_str(), f);
    fclose(f);
  }
  std::string cmd = "timeout " + std::to_string(timeout_s) + " " TRAINYARD_PYTHON " " +
                    path.string() + " '" + url + "' '" + auth_header + "' 2>&1";
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

// A TCP connection to 127.0.0.1:port for hostile-client tests, from `source` (another loopback
// address, such as 127.0.0.2, plays another host); closed when destroyed.
class RawClient {
 public:
  explicit RawClient(int port, const char* source = nullptr) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (source != nullptr && fd_ >= 0) {
      sockaddr_in from{};
      from.sin_family = AF_INET;
      ::inet_pton(AF_INET, source, &from.sin_addr);
      if (::bind(fd_, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0) return;
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    // A small receive buffer, so that a client that does not read stops taking data early.
    int small = 4096;
    if (fd_ >= 0) ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  }
  ~RawClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool connected() const { return connected_; }
  bool send(const std::string& bytes) {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  // Whether the server closed the connection (reads and discards what waits, without blocking).
  bool closed_by_server() {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0) return true;
      if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
    }
  }
  // Reads up to `max` bytes within `timeout`, stopping at "\r\n\r\n" (a response's head).
  std::string read_head(std::chrono::milliseconds timeout, std::size_t max = 4096) {
    std::string got;
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (got.size() < max && got.find("\r\n\r\n") == std::string::npos &&
           std::chrono::steady_clock::now() < end) {
      char c;
      const ssize_t n = ::recv(fd_, &c, 1, MSG_DONTWAIT);
      if (n == 1) {
        got.push_back(c);
      } else if (n == 0) {
        break;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    return got;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

// Raises this process's soft limit on open files to `wanted` (a flood of connections to a server
// in the same process holds two descriptors each); false when the hard limit is lower.
inline bool raise_open_files_limit(rlim_t wanted) {
  rlimit l{};
  if (::getrlimit(RLIMIT_NOFILE, &l) != 0 || l.rlim_max < wanted) return false;
  if (l.rlim_cur >= wanted) return true;
  l.rlim_cur = wanted;
  return ::setrlimit(RLIMIT_NOFILE, &l) == 0;
}

// A WebSocket handshake for `path` as a client sends it (it then never reads, if it so wishes).
inline std::string websocket_handshake(const std::string& path, const std::string& token = "") {
  std::string h = "GET " + path +
                  " HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n";
  if (!token.empty()) h += "Authorization: Bearer " + token + "\r\n";
  return h + "\r\n";
}

}  // namespace trainyard::test
