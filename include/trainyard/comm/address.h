// Small questions about network addresses that the launcher and the process group both ask.
#pragma once

#include <string>

namespace trainyard {

// True for "localhost", 127.0.0.0/8 and ::1 (numeric addresses; names other than localhost are
// not resolved).
bool is_loopback_address(const std::string& addr);

// True when `host` (a name or an address) resolves to an address this machine has, so that a
// server can listen there.
bool is_local_address(const std::string& host);

}  // namespace trainyard
