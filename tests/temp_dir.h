// A temporary folder for one test (unit, multi-process or end-to-end), removed with everything in
// it when the test ends. The one definition: multiproc_util.h names it mptest::TempDir.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <system_error>

#include "trainyard/remove_tree.h"

namespace trainyard::test {

// A fresh folder $TMPDIR/<prefix>-XXXXXX, made by the constructor (which throws if mkdtemp fails)
// and removed by the destructor, which never throws.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "ty-test") {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr)
      throw std::runtime_error("mkdtemp failed: " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    trainyard::remove_tree(path_.string(), ec);  // not remove_all: see remove_tree.h
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

// std::filesystem::remove_all(path) for tests, through remove_tree (see remove_tree.h): removes
// `path` with everything under it, a missing path is no error, a failure throws
// std::filesystem::filesystem_error naming it.
inline void remove_all(const std::filesystem::path& path) {
  std::error_code ec;
  trainyard::remove_tree(path.string(), ec);
  if (ec) throw std::filesystem::filesystem_error("remove_tree", path, ec);
}

// Writes `text` to `path` (replacing it), making its parent folders first.
inline void write_text(const std::filesystem::path& path, const std::string& text) {
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out.flush()) throw std::runtime_error("cannot write " + path.string());
}

}  // namespace trainyard::test
