#include "trainyard/data/idx.h"

#include <sys/stat.h>
#include <zlib.h>

#include <memory>

#include "trainyard/error.h"

namespace trainyard::data {
namespace {

constexpr std::uint8_t kTypeUnsignedByte = 0x08;
constexpr std::int64_t kMaxElements = std::int64_t{1} << 36;  // 64 GiB of bytes

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<std::remove_pointer_t<gzFile>, GzCloser>;

// Reads exactly `size` bytes; answers how many were read before the end of the stream.
std::size_t read_fully(gzFile f, void* out, std::size_t size, const std::string& path) {
  auto* p = static_cast<char*>(out);
  std::size_t done = 0;
  while (done < size) {
    unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(size - done, 1u << 30));
    int n = gzread(f, p + done, chunk);
    if (n < 0) {
      int code = 0;
      const char* msg = gzerror(f, &code);
      throw CorruptDataError(detail::concat("IDX file ", path, " cannot be decompressed: ", msg,
                                            ". HINT: the file is damaged; reinstall it."));
    }
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  return done;
}

}  // namespace

torch::Tensor read_idx_ubyte(const std::string& path, int expected_dims) {
  struct stat st {};
  TY_CHECK_T(Error, ::stat(path.c_str(), &st) == 0, "IDX file ", path,
             " does not exist. HINT: FashionMNIST comes from the Debian package "
             "dataset-fashion-mnist (apt-get install dataset-fashion-mnist); or pass the folder "
             "that holds it.");
  GzFile file(gzopen(path.c_str(), "rb"));
  TY_CHECK_T(Error, file != nullptr, "IDX file ", path, " cannot be opened.");

  std::uint8_t magic[4] = {};
  auto got = read_fully(file.get(), magic, sizeof magic, path);
  TY_CHECK_T(CorruptDataError, got == sizeof magic, "IDX file ", path,
             " is truncated: it ends inside the 4-byte magic number.");
  TY_CHECK_T(CorruptDataError, magic[0] == 0 && magic[1] == 0, "IDX file ", path,
             " has a wrong magic number (first bytes ", int(magic[0]), " ", int(magic[1]),
             ", expected 0 0): it is not an IDX file.");
  TY_CHECK_T(CorruptDataError, magic[2] == kTypeUnsignedByte, "IDX file ", path,
             " holds element type 0x", std::hex, int(magic[2]), std::dec,
             "; only unsigned bytes (0x08) are supported.");
  TY_CHECK_T(CorruptDataError, magic[3] == expected_dims, "IDX file ", path, " has ", int(magic[3]),
             " dimensions where ", expected_dims, " were expected.");

  std::vector<std::int64_t> sizes(expected_dims);
  std::int64_t numel = 1;
  for (int d = 0; d < expected_dims; ++d) {
    std::uint8_t be[4] = {};
    got = read_fully(file.get(), be, sizeof be, path);
    TY_CHECK_T(CorruptDataError, got == sizeof be, "IDX file ", path,
               " is truncated: it ends inside the header.");
    sizes[d] = (std::int64_t(be[0]) << 24) | (be[1] << 16) | (be[2] << 8) | be[3];
    TY_CHECK_T(CorruptDataError, sizes[d] > 0 && numel <= kMaxElements / sizes[d], "IDX file ",
               path, " has an implausible header: dimension ", d, " is ", sizes[d], " (at most ",
               kMaxElements, " elements in all are accepted).");
    numel *= sizes[d];
  }
  auto out = torch::empty(sizes, torch::kUInt8);
  got = read_fully(file.get(), out.data_ptr<std::uint8_t>(), static_cast<std::size_t>(numel), path);
  TY_CHECK_T(CorruptDataError, static_cast<std::int64_t>(got) == numel, "IDX file ", path,
             " is truncated: the header promises ", numel, " bytes of data but only ", got,
             " follow. HINT: the file is damaged; reinstall it.");
  return out;
}

}  // namespace trainyard::data
