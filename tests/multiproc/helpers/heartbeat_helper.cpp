// A rank for the launcher's hang-watchdog tests: runs a small script of steps, chosen by RANK and
// TORCHELASTIC_RESTART_COUNT: argument 1 + RANK + WORLD_SIZE * RESTART_COUNT when given, else
// argument 1 + RANK. Steps, separated by ';':
//   beat=MS    call trainyard::heartbeat() every 20 ms for MS ms (-1: forever)
//   sleep=MS   sleep without beating
//   stop       SIGSTOP itself (a hung rank)
//   err=TEXT   write TEXT and a newline to stderr
//   exit=CODE  exit with CODE
// After the last step it exits 0.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "trainyard/heartbeat.h"

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

void run_step(const std::string& step) {
  using namespace std::chrono;
  const auto eq = step.find('=');
  const std::string name = step.substr(0, eq);
  const std::string value = eq == std::string::npos ? "" : step.substr(eq + 1);
  if (name == "beat") {
    const long ms = std::stol(value);
    const auto end = steady_clock::now() + milliseconds(ms);
    while (ms < 0 || steady_clock::now() < end) {
      trainyard::heartbeat();
      std::this_thread::sleep_for(milliseconds(20));
    }
  } else if (name == "sleep") {
    std::this_thread::sleep_for(milliseconds(std::stol(value)));
  } else if (name == "stop") {
    ::raise(SIGSTOP);
  } else if (name == "err") {
    std::fprintf(stderr, "%s\n", value.c_str());
    std::fflush(stderr);
  } else if (name == "exit") {
    std::exit(std::stoi(value));
  } else {
    std::fprintf(stderr, "heartbeat_helper: unknown step '%s'\n", step.c_str());
    std::exit(100);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int rank = env_int("RANK", 0);
  const int world = env_int("WORLD_SIZE", 1);
  const int restart = env_int("TORCHELASTIC_RESTART_COUNT", 0);
  int index = 1 + rank + world * restart;
  if (index >= argc) index = 1 + rank;
  if (index >= argc) return 0;
  const std::string script = argv[index];
  std::size_t start = 0;
  while (start <= script.size()) {
    std::size_t end = script.find(';', start);
    if (end == std::string::npos) end = script.size();
    if (end > start) run_step(script.substr(start, end - start));
    start = end + 1;
  }
  return 0;
}
