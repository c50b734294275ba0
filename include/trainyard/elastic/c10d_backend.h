// The c10d rendezvous backend: the state lives in a c10d TCPStore at the rendezvous endpoint.
// The agent on the endpoint's host serves the store (the first to bind the port, when several
// agents share a host); the others connect to it as clients. As with torchrun's c10d backend,
// the run depends on the serving agent: when it exits, the others lose the rendezvous.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "trainyard/elastic/rendezvous.h"

namespace trainyard::elastic {

struct C10dBackendOptions {
  std::string host;
  std::uint16_t port = 29400;  // torchrun's default rendezvous port
  std::string key;             // the state's key, e.g. "/trainyard/rdzv/<run_id>/state"
  // Connecting to the store at start (a client retries until then: the serving agent may start
  // later).
  std::chrono::milliseconds timeout{60'000};
  // Each request, and each reconnect after a failed one (Note [Backend outages] in rendezvous.h).
  std::chrono::milliseconds request_timeout{10'000};
  // Serve the store when the endpoint is on this host; false: always connect as a client.
  bool may_serve = true;
};

// Throws NetworkError naming the endpoint when the store cannot be reached within the timeout.
// Afterwards a failed call throws NetworkError ("No answer from the rendezvous store at ADDR:PORT
// for N s: ...") and the next call connects again.
std::unique_ptr<RendezvousBackend> make_c10d_backend(const C10dBackendOptions& options);

}  // namespace trainyard::elastic
