#include "trainyard/cluster/auth.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "trainyard/cluster/api.h"
#include "trainyard/error.h"

namespace trainyard::cluster {
namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

std::string octal_mode(unsigned mode) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%03o", mode & 0777);
  return buf;
}

// The host part of a Host header: "[::1]:8265" -> "::1", "localhost:80" -> "localhost".
std::string host_of(const std::string& host_header) {
  std::string h = trim(host_header);
  if (!h.empty() && h.front() == '[') {
    size_t close = h.find(']');
    return close == std::string::npos ? h : h.substr(1, close - 1);
  }
  size_t colon = h.find(':');
  return colon == std::string::npos ? h : h.substr(0, colon);
}

// The token of "Bearer <t>" (scheme case-insensitive), or nullopt.
std::optional<std::string> bearer(const std::string& value) {
  std::string v = trim(value);
  const std::string_view prefix = api::kBearerPrefix;
  if (v.size() < prefix.size() || strncasecmp(v.c_str(), prefix.data(), prefix.size()) != 0)
    return std::nullopt;
  return trim(v.substr(prefix.size()));
}

// "uid 1000 (alice)", or "uid 1000" without a password entry.
std::string user_of(uid_t uid) {
  std::string out = "uid " + std::to_string(uid);
  if (const passwd* pw = ::getpwuid(uid); pw != nullptr && pw->pw_name != nullptr)
    out += std::string(" (") + pw->pw_name + ")";
  return out;
}

// Whether this process may trust a file or folder owned by `uid`: its own user's or root's, as
// sshd's StrictModes asks of authorized_keys.
bool trusted_owner(uid_t uid) {
  return uid == ::geteuid() || uid == 0;
}

}  // namespace

// Note [A token file only its user controls]
// The token is the cluster's one secret: whoever knows it runs commands on every worker. A head
// running as root that read a token file another user owns (or wrote, through a folder others may
// write) would serve a token that user knows, and a 1-character token is guessed at once. So, as
// sshd's StrictModes: the file and its folder must belong to this user or root, the file must be
// unreadable to group and others, the folder unwritable to them (unless sticky, as /tmp, where
// no one may replace another's file); the head refuses a token shorter than kMinTokenChars; and
// the state directory, which holds a token the head made, must be this user's.
std::string load_token(const std::filesystem::path& token_file) {
  struct stat st {};
  if (::stat(token_file.c_str(), &st) != 0) {
    throw InvalidArgumentError("Cannot read the token file " + token_file.string() + ": " +
                               std::strerror(errno) + ".");
  }
  if (S_ISDIR(st.st_mode)) {
    throw InvalidArgumentError("The token file " + token_file.string() +
                               " is a directory. Hint: give the file that holds the token, e.g. " +
                               (token_file / kGeneratedTokenFile).string() + ".");
  }
  if (!trusted_owner(st.st_uid)) {
    throw InvalidArgumentError(
        "The token file " + token_file.string() + " belongs to " + user_of(st.st_uid) +
        ", not to this user (" + user_of(::geteuid()) +
        ") or root: its owner knows the token and may change it. Hint: use a token file of "
        "your own (`chown` it, or copy it and `chmod 600` the copy).");
  }
  const auto folder =
      token_file.has_parent_path() ? token_file.parent_path() : std::filesystem::path(".");
  struct stat dir {};
  if (::stat(folder.c_str(), &dir) == 0 &&
      (!trusted_owner(dir.st_uid) || ((dir.st_mode & 022) != 0 && (dir.st_mode & S_ISVTX) == 0))) {
    throw InvalidArgumentError(
        "The token file's folder " + folder.string() + " belongs to " + user_of(dir.st_uid) +
        " with mode " + octal_mode(dir.st_mode) +
        ": someone other than this user or root may replace the token there. Hint: keep the "
        "token file in a folder of your own that only you may write (`chmod go-w`).");
  }
  if ((st.st_mode & 077) != 0) {
    throw InvalidArgumentError(
        "The token file " + token_file.string() + " has mode " + octal_mode(st.st_mode) +
        ": group or others may read it. Hint: run `chmod 600 " + token_file.string() + "`.");
  }
  std::ifstream in(token_file);
  if (!in) {
    throw InvalidArgumentError("Cannot open the token file " + token_file.string() + ".");
  }
  std::stringstream buf;
  buf << in.rdbuf();
  std::string token = trim(buf.str());
  if (token.empty()) {
    throw InvalidArgumentError("The token file " + token_file.string() +
                               " is empty. Hint: write a long random token into it, e.g. "
                               "`openssl rand -hex 32 > " +
                               token_file.string() + "`.");
  }
  return token;
}

// Note [Secure by default]
// Loopback is shared by every user and container on a host, so a head without a token let any
// of them run commands as the workers' user. A head given no token therefore makes one: 32 bytes
// from getrandom(2) in <state_dir>/token, mode 0600 in a 0700 folder, kept across restarts (its
// workers and clients keep working). Clients of the same user on the same host find it through
// the default state directory (~/.trainyard/head/token); others get it as a file
// (--token-file) or TRAINYARD_TOKEN. Serving without a token takes --insecure-no-token, and even
// then only on loopback, refusing browsers' writes and foreign Host headers.

void check_token_strength(const std::string& token, const std::string& source) {
  if (token.size() >= kMinTokenChars) return;
  throw InvalidArgumentError(detail::concat(
      source, " holds a token of ", token.size(), " character", token.size() == 1 ? "" : "s",
      "; the head takes one of at least ", kMinTokenChars,
      ", as a shorter one can be guessed (Note [A token file only its user controls]). Hint: "
      "`openssl rand -hex 32` makes a good one."));
}

GeneratedToken load_or_create_token(const std::filesystem::path& file) {
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == EEXIST) return {.token = load_token(file), .made = false};
    throw Error("Cannot create the token file " + file.string() + ": " + std::strerror(errno) +
                ".");
  }
  unsigned char bytes[32];
  std::size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      ::unlink(file.c_str());
      throw Error(std::string("Cannot read random bytes for a token: ") + std::strerror(errno));
    }
    got += static_cast<std::size_t>(n);
  }
  std::string token;
  for (unsigned char b : bytes) {
    static constexpr char kHex[] = "0123456789abcdef";
    token += kHex[b >> 4];
    token += kHex[b & 15];
  }
  const std::string text = token + "\n";
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!written || !synced) {
    ::unlink(file.c_str());
    throw Error("Cannot write the token file " + file.string() + ".");
  }
  return {.token = token, .made = true};
}

std::filesystem::path default_head_state_dir() {
  const char* home = std::getenv("HOME");
  std::string dir = home != nullptr ? home : "";
  if (dir.empty()) {
    if (const passwd* pw = ::getpwuid(::getuid()); pw != nullptr && pw->pw_dir != nullptr)
      dir = pw->pw_dir;
  }
  if (dir.empty()) {
    throw InvalidArgumentError(
        "There is no home directory for the head's default state directory. Hint: pass "
        "--state-dir.");
  }
  return std::filesystem::path(dir) / ".trainyard" / "head";
}

bool is_loopback_address(const std::string& address) {
  std::string a = address;
  if (a.size() >= 2 && a.front() == '[' && a.back() == ']') a = a.substr(1, a.size() - 2);
  if (a == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, a.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, a.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&v6)) return v6.s6_addr[12] == 127;
  }
  return false;
}

void check_bind_policy(const std::string& bind_address, const std::optional<std::string>& token) {
  if (is_loopback_address(bind_address) || token.has_value()) return;
  throw InvalidArgumentError(
      "--bind " + bind_address +
      " listens beyond this machine, which needs a token: give --token-file (a file only you can "
      "read, e.g. `openssl rand -hex 32 > ~/.trainyard/token && chmod 600 ~/.trainyard/token`) or "
      "set TRAINYARD_TOKEN, or bind 127.0.0.1.");
}

bool constant_time_equal(const std::string& a, const std::string& b) {
  // Every byte of the longer string is visited whatever the content.
  size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

std::optional<net::ServerResponse> check_request(const net::ServerRequest& request,
                                                 const std::optional<std::string>& token) {
  if (token) {
    std::optional<std::string> given;
    for (std::string_view name : {api::kAuthorizationHeader, api::kRayAuthorizationHeader}) {
      std::string value = request.header(std::string(name));
      if (value.empty()) continue;
      given = bearer(value);
      if (given && constant_time_equal(*given, *token)) return std::nullopt;
    }
    if (!given) {
      return net::ServerResponse::json_error(
          401,
          "This head requires a token: send 'Authorization: Bearer <token>' (or "
          "X-Ray-Authorization). Hint: pass --token-file or set TRAINYARD_TOKEN.");
    }
    return net::ServerResponse::json_error(403, "The token sent is not this head's token.");
  }
  // Tokenless: the head listens on loopback only; keep browsers' pages out.
  std::string host = request.header("Host");
  if (!host.empty() && !is_loopback_address(host_of(host))) {
    return net::ServerResponse::json_error(
        403, "Refused a request for host '" + host_of(host) +
                 "': a head without a token answers only requests for a loopback host.");
  }
  const std::string& m = request.method;
  // A WebSocket handshake is a GET, but no same-origin rule keeps a page from reading what comes
  // back on it (a job's logs): a browser's upgrade is refused like a browser's change.
  const bool upgrade = !request.header("Upgrade").empty();
  if ((m == "POST" || m == "PUT" || m == "DELETE" || m == "PATCH" || upgrade) &&
      !request.header("Origin").empty()) {
    return net::ServerResponse::json_error(
        403, "Refused a " + (upgrade ? std::string("WebSocket") : m) +
                 " from a browser page (an Origin header): a head without a token accepts "
                 "changes and log tails only from non-browser clients. Hint: give the head a "
                 "--token-file.");
  }
  return std::nullopt;
}

}  // namespace trainyard::cluster
