// remove_tree: a folder and everything under it, like std::filesystem::remove_all, through the C
// library's nftw(3) instead. A program linked against a pip LibTorch 2.x binds
// std::filesystem::remove_all to libtorch.so's exported copy, which crashes (Note [libstdc++
// before LibTorch] in CMakeLists.txt); trainyard removes trees through this instead.
#pragma once

#include <cstdint>
#include <string>
#include <system_error>

namespace trainyard {

// Removes `path` (a file, a symbolic link itself, or a folder with everything below it, never
// following links). A missing path is not an error. Returns the entries removed; on failure sets
// `error` (from errno) and returns what was removed before it.
std::uintmax_t remove_tree(const std::string& path, std::error_code& error);

}  // namespace trainyard
