// hf::Tokenizer's decoders: ids to their tokens' text, then the tokenizer.json's decoder chain
// (ByteLevel for GPT-2's byte-level tokens; Replace, ByteFallback, Fuse, Strip or Metaspace for
// SentencePiece's "▁" tokens), as HF's Tokenizer::decode runs them.
#include <algorithm>
#include <string>
#include <vector>

#include "hf/tokenizer_impl.h"

// Note [Decoder chain]
// HF's decode turns the ids into their tokens' text (dropping ids it does not know, and special
// tokens when asked), hands that list of strings to each decoder of the chain in turn, each
// returning a new list, and joins the last list without separators; with no decoder at all it
// joins the tokens with spaces. Llama 2's chain is Replace("▁" -> " "), ByteFallback (runs of
// "<0x..>" tokens become the bytes they stand for), Fuse (one string) and Strip (one leading
// space: the "▁" the normaliser prepended). A decoder that reads bytes (ByteLevel, ByteFallback)
// makes text of them as HF does when `lossy`: ByteLevel with from_utf8_lossy (one U+FFFD per
// maximal ill-formed part), ByteFallback with one U+FFFD per byte of a run that is not UTF-8;
// decode_bytes() keeps the bytes instead.

namespace trainyard::hf {
namespace internal {

std::string byte_fallback_token(unsigned char byte) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  return std::string("<0x") + kHex[byte >> 4] + kHex[byte & 15] + ">";
}

}  // namespace internal

using namespace internal;  // NOLINT(google-build-using-namespace): this class's own parts

namespace {

template <class... F>
struct DecoderOverloaded : F... {
  using F::operator()...;
};

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The byte of a "<0x0A>" token, as HF reads it (Rust's u8::from_str_radix also takes "+A");
// -1 for any other token.
int fallback_byte(std::string_view token) {
  if (token.size() != 6 || !token.starts_with("<0x") || token.back() != '>') return -1;
  const int high = token[3] == '+' ? 0 : hex_digit(token[3]);
  const int low = hex_digit(token[4]);
  return high < 0 || low < 0 ? -1 : high * 16 + low;
}

bool well_formed(std::string_view bytes) {
  for (std::size_t i = 0; i < bytes.size();) {
    const int length = text::sequence_length(bytes, i);
    if (length == 0) return false;
    i += length;
  }
  return true;
}

// Replaces in place every match (of `regex`, else of `literal`) in s by `content`.
void replace_in(std::string& s,
                const std::string& literal,
                const std::optional<Regex>& regex,
                std::string_view content) {
  std::string out;
  if (replace_all(s, literal, regex ? &*regex : nullptr, content, out)) s = std::move(out);
}

// The characters of s, each a view; a byte that starts no well-formed sequence is one.
std::vector<std::string_view> characters(std::string_view s) {
  std::vector<std::string_view> chars;
  for (std::size_t i = 0; i < s.size();) {
    const int length = std::max(1, text::sequence_length(s, i));
    chars.push_back(s.substr(i, length));
    i += length;
  }
  return chars;
}

std::vector<std::string> run_decoder(const DecoderStep& step,
                                     std::vector<std::string> tokens,
                                     bool lossy) {
  return std::visit(
      DecoderOverloaded{[&](const ByteLevelDecoder&) {
                          std::string bytes;
                          for (const auto& t : tokens) bytes += from_byte_level(t);
                          std::string out;
                          if (lossy)
                            text::append_lossy(out, bytes);
                          else
                            out = std::move(bytes);
                          return std::vector<std::string>{std::move(out)};
                        },
                        [&](const ReplaceDecoder& r) {
                          for (auto& t : tokens) replace_in(t, r.literal, r.regex, r.content);
                          return std::move(tokens);
                        },
                        [&](const ByteFallbackDecoder&) {
                          std::vector<std::string> out;
                          std::string bytes;  // a run of byte tokens
                          auto flush = [&] {
                            if (bytes.empty()) return;
                            if (!lossy || well_formed(bytes))
                              out.push_back(bytes);
                            else
                              for (std::size_t i = 0; i < bytes.size(); ++i)
                                out.emplace_back("\uFFFD");
                            bytes.clear();
                          };
                          for (auto& t : tokens) {
                            const int byte = fallback_byte(t);
                            if (byte >= 0) {
                              bytes.push_back(static_cast<char>(byte));
                              continue;
                            }
                            flush();
                            out.push_back(std::move(t));
                          }
                          flush();
                          return out;
                        },
                        [&](const FuseDecoder&) {
                          std::string all;
                          for (const auto& t : tokens) all += t;
                          return std::vector<std::string>{std::move(all)};
                        },
                        [&](const StripDecoder& s) {
                          for (auto& t : tokens) {
                            const auto chars = characters(t);
                            std::size_t first = 0;
                            while (first < std::min(s.start, chars.size()) &&
                                   chars[first] == s.content)
                              ++first;
                            std::size_t last = chars.size();  // one past
                            for (std::size_t i = 0;
                                 i < s.stop && last > first && chars[last - 1] == s.content; ++i)
                              --last;
                            std::string kept;
                            for (std::size_t i = first; i < last; ++i) kept.append(chars[i]);
                            t = std::move(kept);
                          }
                          return std::move(tokens);
                        },
                        [&](const MetaspaceDecoder& m) {
                          for (std::size_t i = 0; i < tokens.size(); ++i) {
                            // HF drops every replacement of the first token, not only a leading
                            // one.
                            replace_in(tokens[i], m.replacement, std::nullopt,
                                       i == 0 && m.drop_first_token_replacements ? "" : " ");
                          }
                          return std::move(tokens);
                        }},
      step);
}

}  // namespace

std::string Tokenizer::Impl::decode(std::span<const std::int32_t> ids,
                                    bool skip_special,
                                    bool lossy) const {
  std::vector<std::int32_t> kept;
  kept.reserve(ids.size());
  for (std::int32_t id : ids) {
    if (id < 0 || static_cast<std::size_t>(id) >= token_known.size() || !token_known[id]) continue;
    if (skip_special && token_special[id]) continue;
    kept.push_back(id);
  }
  std::string out;
  if (!has_decoder) {  // HF joins the tokens with spaces
    for (std::size_t i = 0; i < kept.size(); ++i) {
      if (i > 0) out.push_back(' ');
      out.append(token_text[kept[i]]);
    }
    return out;
  }
  if (byte_level_decoder) {
    std::string bytes;
    for (std::int32_t id : kept) bytes.append(token_bytes[id]);
    if (!lossy) return bytes;
    text::append_lossy(out, bytes);
    return out;
  }
  std::vector<std::string> tokens;  // See Note [Decoder chain]
  tokens.reserve(kept.size());
  for (std::int32_t id : kept) tokens.push_back(token_text[id]);
  for (const DecoderStep& step : decoders) tokens = run_decoder(step, std::move(tokens), lossy);
  for (const auto& t : tokens) out.append(t);
  return out;
}

}  // namespace trainyard::hf
