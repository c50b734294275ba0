#include "trainyard/error.h"

namespace trainyard::detail {

void throw_assert(const char* expr, const char* file, int line, const std::string& msg) {
  throw Error(concat("Internal error (a bug in trainyard): ", expr, " failed at ", file, ":", line,
                     msg.empty() ? "" : ": ", msg));
}

}  // namespace trainyard::detail
