#include "trainyard/data/text_lines.h"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "trainyard/checkpoint/checkpointer.h"
#include "trainyard/data/data_file.h"
#include "trainyard/error.h"
#include "trainyard/ignore_index.h"
#include "trainyard/log.h"
#include "trainyard/storage/storage.h"

namespace trainyard::data {
namespace fs = std::filesystem;
namespace {

// Note [Token cache]
// The file: a line "trainyard-tokens 1\n", a line of JSON naming what it was prepared from
// (corpus_sha256, tokenizer, seq_len, pad_id, lines), then lines x seq_len int32 ids and the lines'
// int32 lengths, little-endian. Written through a temporary name and renamed, so a reader sees a
// whole file or none; one that does not match is prepared again.
constexpr std::string_view kMagic = "trainyard-tokens 1\n";

std::string cache_header(const std::string& corpus_sha,
                         const std::string& tokenizer_id,
                         std::int64_t seq_len,
                         std::int32_t pad_id,
                         std::int64_t lines,
                         std::int64_t skipped) {
  return nlohmann::json{{"corpus_sha256", corpus_sha},
                        {"tokenizer", tokenizer_id},
                        {"seq_len", seq_len},
                        {"pad_id", pad_id},
                        {"lines", lines},
                        {"skipped", skipped}}
             .dump() +
         "\n";
}

// The cached lines, or nullopt when `bytes` is not a cache of exactly this preparation.
std::optional<TokenizedLines> parse_cache(std::string_view bytes,
                                          const std::string& corpus_sha,
                                          const std::string& tokenizer_id,
                                          std::int64_t seq_len,
                                          std::int32_t pad_id) {
  if (bytes.substr(0, kMagic.size()) != kMagic) return std::nullopt;
  bytes.remove_prefix(kMagic.size());
  const auto eol = bytes.find('\n');
  if (eol == std::string_view::npos) return std::nullopt;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.substr(0, eol));
  } catch (const std::exception&) {
    return std::nullopt;
  }
  const std::int64_t lines = header.value("lines", std::int64_t{-1});
  const std::int64_t skipped = header.value("skipped", std::int64_t{-1});
  if (lines < 0 || skipped < 0 ||
      std::string(bytes.substr(0, eol + 1)) !=
          cache_header(corpus_sha, tokenizer_id, seq_len, pad_id, lines, skipped))
    return std::nullopt;
  bytes.remove_prefix(eol + 1);
  const auto count = static_cast<std::size_t>(lines * seq_len + lines);
  if (bytes.size() != count * sizeof(std::int32_t)) return std::nullopt;
  TokenizedLines out{.seq_len = seq_len, .pad_id = pad_id, .skipped = skipped};
  out.ids.resize(static_cast<std::size_t>(lines * seq_len));
  out.lengths.resize(static_cast<std::size_t>(lines));
  std::memcpy(out.ids.data(), bytes.data(), out.ids.size() * sizeof(std::int32_t));
  std::memcpy(out.lengths.data(), bytes.data() + out.ids.size() * sizeof(std::int32_t),
              out.lengths.size() * sizeof(std::int32_t));
  return out;
}

std::string cache_file_name(const std::string& corpus,
                            const std::string& tokenizer_id,
                            std::int64_t seq_len,
                            std::int32_t pad_id) {
  const auto key = checkpoint::sha256_hex(
      detail::concat(tokenizer_id, "|", seq_len, "|", pad_id, "|", fs::absolute(corpus).string()));
  return fs::path(corpus).filename().string() + "." + key.substr(0, 12) + ".tokens";
}

void warn_skipped(const std::string& path, const TokenizedLines& lines) {
  if (lines.skipped == 0) return;
  logger("data")->warn(
      "Skipped {} of the {} training lines of {}: they encode to fewer than 2 tokens, leaving no "
      "token to predict after the shift.",
      lines.skipped, lines.skipped + lines.size(), path);
}

}  // namespace

std::vector<std::string_view> training_lines(std::string_view corpus) {
  std::vector<std::string_view> out;
  while (!corpus.empty()) {
    const auto eol = corpus.find('\n');
    auto line = corpus.substr(0, eol);
    corpus.remove_prefix(eol == std::string_view::npos ? corpus.size() : eol + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line.back() == ':') continue;
    out.push_back(line);
  }
  return out;
}

std::int64_t TokenizedLines::tokens() const {
  std::int64_t n = 0;
  for (auto l : lengths) n += l;
  return n;
}

TokenizedLines tokenize_lines(const std::vector<std::string_view>& lines,
                              const Encoder& encode,
                              std::int64_t seq_len,
                              std::int32_t pad_id) {
  TY_CHECK(seq_len >= 2, "--seq-len must be >= 2 (a token and the next to predict), got ", seq_len,
           ".");
  TokenizedLines out{.seq_len = seq_len, .pad_id = pad_id};
  out.ids.reserve(lines.size() * static_cast<std::size_t>(seq_len));
  for (auto line : lines) {
    auto ids = encode(line);
    if (ids.size() < 2) {  // no target token after the shift
      ++out.skipped;
      continue;
    }
    const auto n = std::min<std::int64_t>(seq_len, static_cast<std::int64_t>(ids.size()));
    out.ids.insert(out.ids.end(), ids.begin(), ids.begin() + n);
    out.ids.insert(out.ids.end(), static_cast<std::size_t>(seq_len - n), pad_id);
    out.lengths.push_back(static_cast<std::int32_t>(n));
  }
  return out;
}

PreparedText prepare_text(const std::string& path,
                          const std::string& tokenizer_id,
                          const Encoder& encode,
                          std::int64_t seq_len,
                          std::int32_t pad_id) {
  const std::string corpus = read_data_file(path, "--data names a text file to train on.");
  const std::string corpus_sha = checkpoint::sha256_hex(corpus);
  const std::string name = cache_file_name(path, tokenizer_id, seq_len, pad_id);
  // Next to the corpus when its folder is writable, else in the user's cache folder.
  std::string dir = fs::absolute(path).parent_path().string();
  if (::access(dir.c_str(), W_OK) != 0) {
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    dir = xdg != nullptr && *xdg != '\0' ? std::string(xdg) + "/trainyard"
          : home != nullptr              ? std::string(home) + "/.cache/trainyard"
                                         : std::string("/tmp/trainyard-cache");
  }
  PreparedText out;
  out.cache_path = (fs::path(dir) / name).string();
  auto store = storage::open_storage(dir);
  if (auto bytes = store->read(name)) {
    if (auto cached = parse_cache(*bytes, corpus_sha, tokenizer_id, seq_len, pad_id)) {
      out.lines = std::move(*cached);
      out.from_cache = true;
      warn_skipped(path, out.lines);
      return out;
    }
    logger("data")->warn("The token cache {} does not match {} (or is damaged): preparing again.",
                         out.cache_path, path);
  }
  const auto lines = training_lines(corpus);
  TY_CHECK(!lines.empty(), "The corpus ", path,
           " has no training line (lines that are not empty and do not end in ':').");
  out.lines = tokenize_lines(lines, encode, seq_len, pad_id);
  TY_CHECK(out.lines.size() > 0, "The corpus ", path, " leaves nothing to train on: all ",
           lines.size(),
           " of its training lines encode to fewer than 2 tokens, so none has a "
           "token to predict after the first. HINT: check that the tokenizer is the model's; "
           "lines of one word each need joining into longer records.");
  warn_skipped(path, out.lines);
  std::string bytes(kMagic);
  bytes +=
      cache_header(corpus_sha, tokenizer_id, seq_len, pad_id, out.lines.size(), out.lines.skipped);
  bytes.append(reinterpret_cast<const char*>(out.lines.ids.data()),
               out.lines.ids.size() * sizeof(std::int32_t));
  bytes.append(reinterpret_cast<const char*>(out.lines.lengths.data()),
               out.lines.lengths.size() * sizeof(std::int32_t));
  try {
    store->write(name, bytes);
  } catch (const std::exception& e) {
    logger("data")->warn("Cannot cache the prepared tokens at {}: {}", out.cache_path, e.what());
  }
  return out;
}

LmBatch causal_lm_batch(const TokenizedLines& lines, const std::vector<std::int64_t>& indices) {
  const auto batch = static_cast<std::int64_t>(indices.size());
  auto inputs = torch::empty({batch, lines.seq_len}, torch::kInt64);
  auto labels = torch::empty({batch, lines.seq_len}, torch::kInt64);
  auto* in = inputs.data_ptr<std::int64_t>();
  auto* lab = labels.data_ptr<std::int64_t>();
  LmBatch out;
  for (std::int64_t b = 0; b < batch; ++b) {
    const auto row = indices[static_cast<std::size_t>(b)];
    TY_CHECK(row >= 0 && row < lines.size(), "Line ", row, " is outside the ", lines.size(),
             " prepared lines.");
    const std::int32_t* ids = lines.ids.data() + row * lines.seq_len;
    const std::int32_t length = lines.lengths[static_cast<std::size_t>(row)];
    for (std::int64_t t = 0; t < lines.seq_len; ++t) {
      in[b * lines.seq_len + t] = ids[t];
      lab[b * lines.seq_len + t] = t < length ? ids[t] : kIgnoreIndex;
    }
    out.tokens += length;
  }
  out.input_ids = inputs;
  out.labels = labels;
  return out;
}

}  // namespace trainyard::data
