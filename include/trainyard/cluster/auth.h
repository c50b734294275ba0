// Authentication of the cluster's HTTP calls: the shared token (from a file only its owner can
// read), the bind policy (no token, no listening beyond loopback) and the check run before every
// request (Bearer token in Authorization or X-Ray-Authorization; without a token, loopback only
// and no browser-origin writes). The token is never logged nor put into an error message.
#pragma once

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>

#include "trainyard/net/http_server.h"

namespace trainyard::cluster {

// Reads the token from a file: surrounding whitespace is trimmed. InvalidArgumentError when the
// file cannot be read, is a directory, belongs to a user other than this one or root, lies in a
// folder such a user owns or others may write (not sticky), when group or others may read it (the
// message names the file, its mode and the fix, `chmod 600`), or when it holds no token. See
// Note [A token file only its user controls] in auth.cpp.
std::string load_token(const std::filesystem::path& token_file);

// The head refuses a shorter token: a guessable secret.
inline constexpr std::size_t kMinTokenChars = 16;
// InvalidArgumentError naming `source` (where the token came from) when `token` is shorter than
// kMinTokenChars. The message never holds the token.
void check_token_strength(const std::string& token, const std::string& source);

// The token a head makes for itself when it is given none: <state_dir>/kGeneratedTokenFile.
inline constexpr const char* kGeneratedTokenFile = "token";

// The token in `file` (load_token's checks) when it exists; otherwise a new one (32 random bytes
// from the kernel, as hex) written there with mode 0600. See Note [Secure by default].
struct GeneratedToken {
  std::string token;
  bool made = false;  // made now, rather than read from an earlier start
};
GeneratedToken load_or_create_token(const std::filesystem::path& file);

// Where `trainyard head` keeps its state when --state-dir is not given, and where a client on the
// same host finds a head's generated token: $HOME/.trainyard/head (the password entry's home
// when HOME is unset). InvalidArgumentError when there is no home directory.
std::filesystem::path default_head_state_dir();

// True for 127.0.0.0/8, ::1 and "localhost".
bool is_loopback_address(const std::string& address);

// The bind policy: InvalidArgumentError naming --bind and --token-file when bind_address is not
// loopback and there is no token.
void check_bind_policy(const std::string& bind_address, const std::optional<std::string>& token);

// Compares in time independent of where the strings differ (length differences excepted).
bool constant_time_equal(const std::string& a, const std::string& b);

// The check for one request: nullopt when it may proceed, otherwise the response to send:
// with a token, 401 without credentials and 403 with a wrong token; without one, 403 for a
// POST/PUT/DELETE carrying an Origin header (a browser) or a Host header that is not loopback
// (DNS rebinding). Thread-safe (reads only).
std::optional<net::ServerResponse> check_request(const net::ServerRequest& request,
                                                 const std::optional<std::string>& token);

}  // namespace trainyard::cluster
