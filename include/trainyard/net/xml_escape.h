// XML's five-character escaping of text and attribute values (&, <, >, "), shared by the S3
// client's request bodies and the SVG charts of `trainyard bench scaling`.
#pragma once

#include <string>
#include <string_view>

namespace trainyard::net {

inline std::string xml_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace trainyard::net
