// The etcd rendezvous backend (torchrun's --rdzv-backend etcd): the state is one key in an etcd v3
// cluster, read with a range request and changed by a transaction that compares the key's
// mod_revision (the version token). It speaks etcd's JSON gateway (POST /v3/kv/range and
// /v3/kv/txn, etcd >= 3.4) through net::HttpClient; see Note [etcd JSON gateway] in
// etcd_backend.cpp.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "trainyard/elastic/rendezvous.h"

namespace trainyard::elastic {

struct EtcdOptions {
  std::string endpoint;  // "host:port" or "http://host:port"; port default 2379
  std::string key;       // the state's key, e.g. "/trainyard/rdzv/<run_id>/state"
  // Per request, connect included. etcd answers in milliseconds; a request that hangs (a cut
  // network) must not stall the agent for long: the rendezvous retries (Note [Backend outages]).
  std::chrono::milliseconds timeout{5'000};
  int max_attempts = 3;  // for each request, when etcd cannot be reached or is unavailable
};

// Validates the options (InvalidArgumentError naming the field) and returns the backend; nothing
// is sent until the first call. Each call blocks for one request, retried with a short backoff,
// so it takes at most about max_attempts * timeout; when every attempt failed it throws
// NetworkError naming the endpoint, the attempts and the time they took, and Error for an answer
// it cannot use (an HTTP error).
// Thread-safe: concurrent calls run on connections of their own (net::HttpClient).
std::unique_ptr<RendezvousBackend> make_etcd_backend(EtcdOptions options);

}  // namespace trainyard::elastic
