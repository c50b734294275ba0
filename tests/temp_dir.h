// A temporary folder for one test, removed with everything in it when the test ends.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

#include "trainyard/remove_tree.h"

namespace trainyard::test {

struct TempDir {
  std::filesystem::path path;

  explicit TempDir(const std::string& prefix = "ty-test") {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr)
      throw std::runtime_error("mkdtemp failed: " + pattern);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    trainyard::remove_tree(path.string(), ec);  // not remove_all: see remove_tree.h
  }
  std::string str() const { return path.string(); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace trainyard::test
