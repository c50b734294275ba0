#include "trainyard/data/data_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "trainyard/error.h"

namespace trainyard::data {
namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a pipe";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

std::string read_data_file(const std::string& path, const std::string& hint) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int error = errno;
    throw InvalidArgumentError(detail::concat(
        "--data ", path, error == ENOENT ? " does not exist" : " cannot be read",
        error == ENOENT ? "" : detail::concat(": ", std::strerror(error)), ". HINT: ", hint));
  }
  TY_CHECK(S_ISREG(st.st_mode), "--data ", path, " is ", kind_of(st.st_mode),
           ": the recipe reads a whole file into memory, so it takes a regular file (save a "
           "pipe's output to one first). HINT: ",
           hint);
  std::ifstream in(path, std::ios::binary);
  TY_CHECK(in.good(), "--data ", path, " cannot be read: ", std::strerror(errno), ". HINT: ", hint);
  std::string bytes;
  bytes.reserve(static_cast<std::size_t>(st.st_size));
  bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  TY_CHECK(!in.bad(), "--data ", path, " could not be read to its end: ", std::strerror(errno),
           ". HINT: ", hint);
  return bytes;
}

}  // namespace trainyard::data
