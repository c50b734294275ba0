#include "trainyard/remove_tree.h"

#include <ftw.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <mutex>

namespace trainyard {
namespace {

// nftw's callback takes no context: one removal at a time carries its count here.
std::mutex g_mutex;
std::uintmax_t g_removed = 0;
int g_errno = 0;

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  if (std::remove(path) != 0) {
    if (errno == ENOENT) return 0;  // gone meanwhile
    g_errno = errno;
    return 1;  // stop the walk
  }
  ++g_removed;
  return 0;
}

}  // namespace

std::uintmax_t remove_tree(const std::string& path, std::error_code& error) {
  error.clear();
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) error = std::error_code(errno, std::generic_category());
    return 0;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  g_removed = 0;
  g_errno = 0;
  // Children before their folder (FTW_DEPTH), links removed rather than followed (FTW_PHYS).
  const int rc = ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  if (rc != 0) error = std::error_code(g_errno != 0 ? g_errno : errno, std::generic_category());
  return g_removed;
}

}  // namespace trainyard
