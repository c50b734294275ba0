// The rendezvous backend a trainyard head serves (`trainyard submit` jobs need no etcd): each run's
// state is one value in the head's SQLite store, read with GET and changed by a compare-and-set
// POST on kHeadRendezvousPath + run id. The head restarting keeps the state; while it is away the
// calls fail with NetworkError and the rendezvous rides the outage out (Note [Backend outages]).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "trainyard/elastic/rendezvous.h"

namespace trainyard::elastic {

// The head's rendezvous path; the run id follows it. The head serves what this names.
inline constexpr const char* kHeadRendezvousPath = "/api/cluster/rdzv/";

// The messages of kHeadRendezvousPath, written once for the head and this backend.
// POST {"state": S, "token": T or null}: write S if the stored token is T (null: none stored).
struct HeadRdzvWrite {
  std::string state;
  std::optional<std::string> token;
};
// GET's answer {"state", "token"} and POST's, which adds "written".
struct HeadRdzvState {
  std::string state;
  std::string token;
  std::optional<bool> written;  // POST only
};
// from_json throws InvalidArgumentError naming the field.
void to_json(nlohmann::json& j, const HeadRdzvWrite& v);
void from_json(const nlohmann::json& j, HeadRdzvWrite& v);
void to_json(nlohmann::json& j, const HeadRdzvState& v);
void from_json(const nlohmann::json& j, HeadRdzvState& v);

struct HeadBackendOptions {
  std::string head;    // "host:port" or "http://host:port"; the name is resolved on every call
  std::string run_id;  // the job's id
  std::optional<std::string> token;  // sent as "Authorization: Bearer <token>"
  // Per request, connect included; the rendezvous retries (Note [Backend outages]).
  std::chrono::milliseconds timeout{5'000};
  int max_attempts = 2;  // per call, when the head cannot be reached or answers 5xx
};

// Validates the options (InvalidArgumentError naming the field); nothing is sent until the first
// call. Each call blocks for at most about max_attempts * timeout, then throws NetworkError
// naming the head and every attempt; an answer it cannot use (401, 403, 400) is an Error.
// Thread-safe.
std::unique_ptr<RendezvousBackend> make_head_backend(HeadBackendOptions options);

}  // namespace trainyard::elastic
