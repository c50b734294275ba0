// trainyard's exception hierarchy: every error the library throws derives from trainyard::Error,
// with a few typed children callers can act on. Check macros that print both operands live here
// too; internal invariants use TY_ASSERT, which reports a bug rather than bad input.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace trainyard {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A wait ran past its deadline (a collective, a rendezvous, a child process).
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// A peer could not be reached, or the connection to it broke.
class NetworkError : public Error {
 public:
  using Error::Error;
};

// The user gave something the library cannot use (a flag, a variable, an option field).
class InvalidArgumentError : public Error {
 public:
  using Error::Error;
};

// A file that should hold data in a known format does not (bad magic, truncated, wrong size).
class CorruptDataError : public Error {
 public:
  using Error::Error;
};

// A checkpoint failed its integrity checks.
class CheckpointCorruptError : public CorruptDataError {
 public:
  using CorruptDataError::CorruptDataError;
};

// A loss or a weight became NaN or Inf: training cannot go on from this step (Note [Non-finite
// training] in train/trainer.cpp).
class NonFiniteError : public Error {
 public:
  using Error::Error;
};

// The rendezvous was closed (the job finished or gave up) while this node waited on it.
class RendezvousClosedError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
[[noreturn]] void throw_assert(const char* expr,
                               const char* file,
                               int line,
                               const std::string& msg);
}  // namespace detail

}  // namespace trainyard

// Throws ErrorType with the message pieces concatenated, when cond is false.
#define TY_CHECK_T(ErrorType, cond, ...)                                    \
  do {                                                                      \
    if (!(cond)) throw ErrorType(::trainyard::detail::concat(__VA_ARGS__)); \
  } while (0)

#define TY_CHECK(cond, ...) TY_CHECK_T(::trainyard::InvalidArgumentError, cond, __VA_ARGS__)

// Checks a == b and prints both operands on failure.
#define TY_CHECK_EQ(a, b, ...)                                                                  \
  do {                                                                                          \
    const auto& ty_a_ = (a);                                                                    \
    const auto& ty_b_ = (b);                                                                    \
    if (!(ty_a_ == ty_b_))                                                                      \
      throw ::trainyard::Error(::trainyard::detail::concat(__VA_ARGS__, " (", #a, " = ", ty_a_, \
                                                           ", ", #b, " = ", ty_b_, ")"));       \
  } while (0)

// An internal invariant: failing it is a bug in trainyard, not bad input.
#define TY_ASSERT(cond, ...)                                                                      \
  do {                                                                                            \
    if (!(cond))                                                                                  \
      ::trainyard::detail::throw_assert(                                                          \
          #cond, __FILE__, __LINE__, ::trainyard::detail::concat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)
