#include "storage/aws_text.h"

#include <cstdlib>
#include <cstring>

#include "trainyard/utf8.h"

namespace trainyard::storage {

std::string percent_encode(std::string_view s, bool keep_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    const bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                            (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' || c == '~';
    if (unreserved || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string xml_unescape(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const std::size_t semi = s[i] == '&' ? s.find(';', i) : std::string_view::npos;
    if (semi == std::string_view::npos || semi - i > 10) {
      out += s[i];
      continue;
    }
    const std::string_view name = s.substr(i + 1, semi - i - 1);
    if (name == "amp") {
      out += '&';
    } else if (name == "lt") {
      out += '<';
    } else if (name == "gt") {
      out += '>';
    } else if (name == "quot") {
      out += '"';
    } else if (name == "apos") {
      out += '\'';
    } else if (name.size() > 1 && name[0] == '#') {
      const bool hex = name[1] == 'x' || name[1] == 'X';
      const std::string digits(name.substr(hex ? 2 : 1));
      char* end = nullptr;
      const unsigned long cp = std::strtoul(digits.c_str(), &end, hex ? 16 : 10);
      if (digits.empty() || *end != '\0' || cp > 0x10FFFF) {
        out += s[i];
        continue;
      }
      append_utf8(out, static_cast<char32_t>(cp));
    } else {
      out += s[i];
      continue;
    }
    i = semi;
  }
  return out;
}

std::vector<std::string_view> xml_elements(std::string_view xml, std::string_view name) {
  std::vector<std::string_view> out;
  const std::string open = "<" + std::string(name);
  const std::string close = "</" + std::string(name) + ">";
  std::size_t pos = 0;
  while ((pos = xml.find(open, pos)) != std::string_view::npos) {
    pos += open.size();
    // "<Key" must not match "<KeyCount>".
    if (pos >= xml.size() || std::strchr("> \t\r\n/", xml[pos]) == nullptr) continue;
    const std::size_t gt = xml.find('>', pos);
    if (gt == std::string_view::npos) break;
    if (xml[gt - 1] == '/') {
      out.emplace_back();
      pos = gt + 1;
      continue;
    }
    const std::size_t end = xml.find(close, gt + 1);
    if (end == std::string_view::npos) break;
    out.push_back(xml.substr(gt + 1, end - gt - 1));
    pos = end + close.size();
  }
  return out;
}

std::string xml_text(std::string_view xml, std::string_view name) {
  auto found = xml_elements(xml, name);
  return found.empty() ? std::string() : xml_unescape(found.front());
}

}  // namespace trainyard::storage
