// What AWS's HTTP APIs ask of text, shared by the S3 client and the credential providers (STS):
// RFC 3986 percent-encoding for SigV4 paths, queries and form bodies, and reading the few elements
// of their XML answers. Private to src/storage.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace trainyard::storage {

// Percent-encoding as SigV4 canonicalises it: RFC 3986 unreserved characters stay, every other
// byte becomes %XX (upper-case hex). With keep_slash, '/' stays as well (object key paths).
std::string percent_encode(std::string_view s, bool keep_slash = false);

// Decodes the five predefined entities and character references (&#13; &#x1F;); S3 writes
// control characters in keys as the latter. Anything unrecognised is kept as it is.
std::string xml_unescape(std::string_view s);

// The raw content of each <name ...>...</name> element in xml, in order; <name/> gives "".
// Enough for AWS's answers, which have no CDATA, comments or nested elements of one name.
std::vector<std::string_view> xml_elements(std::string_view xml, std::string_view name);

// The decoded text of the first <name> element, or "" when there is none.
std::string xml_text(std::string_view xml, std::string_view name);

}  // namespace trainyard::storage
