// LogCapture: what one trainyard logger prints while the capture lives, for tests that assert on
// warnings (retries, leases taken over, damaged checkpoints).
#pragma once

#include <spdlog/sinks/ostream_sink.h>

#include <algorithm>
#include <memory>
#include <sstream>
#include <string>

#include "trainyard/log.h"

namespace trainyard::test {

class LogCapture {
 public:
  explicit LogCapture(const std::string& component)
      : logger_(logger(component)), sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)) {
    logger_->sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = logger_->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  std::string text() {
    logger_->flush();
    return out_.str();
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> logger_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

}  // namespace trainyard::test
