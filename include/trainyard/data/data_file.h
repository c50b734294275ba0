// The file a recipe's --data names, read whole: a corpus or a file of records.
#pragma once

#include <string>

namespace trainyard::data {

// The bytes of the regular file at `path`. InvalidArgumentError naming --data and `path` when it
// does not exist, is a folder, or is not a regular file (a device such as /dev/zero, a pipe: no
// end to read to, or none known in advance), or cannot be read; `hint` ends each message.
std::string read_data_file(const std::string& path, const std::string& hint);

}  // namespace trainyard::data
