// hf::Tokenizer: encoding (added tokens, the normaliser, then the pre-tokeniser and BPE of
// pre_tokenizer.cpp and bpe.cpp), the template, and the public queries; decoder.cpp decodes and
// tokenizer_json.cpp reads the file.
#include "trainyard/hf/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <variant>

#include "hf/tokenizer_impl.h"
#include "trainyard/cpu_count.h"
#include "trainyard/error.h"
#include "trainyard/log.h"
#include "trainyard/utf8.h"

// Note [Invalid UTF-8]
// HF's tokenizers take Rust strings, which are always well-formed UTF-8, so HF has no answer for
// other bytes. A training corpus can still hold some, and dropping a document for one stray byte
// is worse than keeping it, so encode() takes any bytes: a byte that starts no well-formed
// sequence counts as one character of its own in the class "neither letter, number nor space",
// passes through normalisation untouched (a Split pattern reads it as U+FFFD, a symbol), and is
// encoded by its byte-level token like any other byte, or, in SentencePiece-style BPE, by its
// byte_fallback token ("<0xFF>") or the unknown token. decode_bytes() gives the bytes back;
// decode() replaces them with U+FFFD as HF would.

namespace trainyard::hf {
namespace internal {

// GPT-2's byte -> character map: printable Latin-1 bytes stand for themselves, the other 68 bytes
// for U+0100 upwards in byte order, so every token is printable text ("Ġ" is the space).
std::array<char32_t, 256> byte_to_char() {
  std::array<char32_t, 256> map{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    map[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return map;
}

// The byte-level form of raw bytes, as tokens in the vocabulary are written ("Ġthe" for " the").
std::string to_byte_level(std::string_view bytes) {
  static const std::array<char32_t, 256> map = byte_to_char();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char b : bytes) append_utf8(out, map[static_cast<unsigned char>(b)]);
  return out;
}

// The bytes a token stands for after HF's ByteLevel decoder: each character mapped back to its
// byte, or, when some character is not in the map, the token's own UTF-8.
std::string from_byte_level(std::string_view token) {
  static const StringMap<char> inverse = [] {
    StringMap<char> m;
    const std::array<char32_t, 256> map = byte_to_char();
    for (int b = 0; b < 256; ++b) {
      std::string c;
      append_utf8(c, map[b]);
      m.emplace(std::move(c), static_cast<char>(b));
    }
    return m;
  }();
  std::string out;
  for (std::size_t i = 0; i < token.size();) {
    const int length = text::sequence_length(token, i);
    const auto it = length == 0 ? inverse.end() : inverse.find(token.substr(i, length));
    if (it == inverse.end()) return std::string(token);
    out.push_back(it->second);
    i += length;
  }
  return out;
}

}  // namespace internal

using namespace internal;  // NOLINT(google-build-using-namespace): this class's own parts

namespace {
std::atomic<std::uint64_t> next_serial{1};
}  // namespace

Tokenizer::Impl::Impl() : serial(next_serial++) {}

template <typename OnText>
void Tokenizer::Impl::split_added(std::string_view s,
                                  const AddedTokenTrie& trie,
                                  std::vector<std::int32_t>& ids,
                                  OnText&& on_text) const {
  if (s.empty()) return;  // HF drops empty pieces
  if (trie.empty()) {
    on_text(s);
    return;
  }
  std::size_t handed_on = 0;  // s[0, handed_on) is done
  std::size_t i = 0;
  while (i < s.size()) {
    if (!trie.may_start(s[i])) {
      ++i;
      continue;
    }
    const auto [index, length] = trie.longest_at(s, i);
    if (index < 0) {
      ++i;
      continue;
    }
    const AddedToken& token = added[index];
    std::size_t start = i;
    std::size_t stop = i + length;
    i = stop;  // the next search starts after this match, even when it is discarded
    if (token.single_word && ((start > 0 && text::ends_with_word(s.substr(0, start))) ||
                              (stop < s.size() && text::starts_with_word(s.substr(stop)))))
      continue;
    if (token.lstrip) start -= text::trailing_space_length(s.substr(0, start));
    if (token.rstrip) stop += text::leading_space_length(s.substr(stop));
    start = std::max(start, handed_on);
    if (handed_on < start) on_text(s.substr(handed_on, start - handed_on));
    ids.push_back(token.id);
    handed_on = stop;
  }
  if (handed_on < s.size()) on_text(s.substr(handed_on));
}

namespace {

template <class... F>
struct NormalizerOverloaded : F... {
  using F::operator()...;
};

// Appends s after one normaliser step to out; false (appending nothing) when it changes nothing.
bool normalize_step(const NormalizerStep& step, std::string_view s, std::string& out) {
  return std::visit(
      NormalizerOverloaded{[&](text::NormalForm form) { return text::normalize(form, s, out); },
                           [&](const PrependNormalizer& p) {
                             if (s.empty()) return false;  // HF prepends to non-empty text only
                             out.append(p.prefix);
                             out.append(s);
                             return true;
                           },
                           [&](const ReplaceNormalizer& r) {
                             return replace_all(s, r.literal, r.regex ? &*r.regex : nullptr,
                                                r.content, out);
                           }},
      step);
}

}  // namespace

bool Tokenizer::Impl::normalize_into(std::string_view s, Scratch& scratch) const {
  bool changed = false;
  for (const NormalizerStep& step : normalizers) {
    scratch.normalized_step.clear();
    if (!normalize_step(step, changed ? std::string_view(scratch.normalized) : s,
                        scratch.normalized_step))
      continue;
    std::swap(scratch.normalized, scratch.normalized_step);
    changed = true;
  }
  return changed;
}

void Tokenizer::Impl::encode_text(std::string_view s,
                                  std::vector<std::int32_t>& ids,
                                  Scratch& scratch) const {
  // HF's order: added tokens that match the raw text, then the normaliser on what is left, then
  // added tokens that match normalised text, then the pre-tokeniser and the model on the rest.
  // A piece begins the text when it starts where the text does (offset 0 in HF's terms).
  split_added(s, raw_trie, ids, [&](std::string_view piece) {
    const bool piece_at_start = piece.data() == s.data();
    const std::string_view normalized =
        normalize_into(piece, scratch) ? std::string_view(scratch.normalized) : piece;
    split_added(normalized, normalized_trie, ids, [&](std::string_view rest) {
      pre_tokenize(0, rest, piece_at_start && rest.data() == normalized.data(), ids, scratch);
    });
  });
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_directory(const std::filesystem::path& dir) {
  TY_CHECK(std::filesystem::is_directory(dir), "The model directory ", dir.string(),
           " does not exist. HINT: give the folder that holds the model's tokenizer.json.");
  const std::filesystem::path file = dir / kTokenizerFileName;
  if (std::filesystem::exists(file)) return from_file(file);
  logger("tokenizer")
      ->info("{} has no {}: using byte-level ids (0-255)", dir.string(), kTokenizerFileName);
  return byte_level();
}

Tokenizer Tokenizer::byte_level() {
  auto impl = std::make_unique<Impl>();
  impl->source = "byte-level";
  impl->byte_level = true;
  return Tokenizer(std::move(impl));
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  if (impl_->byte_level) {
    std::vector<std::int32_t> ids(text.size());
    std::transform(text.begin(), text.end(), ids.begin(),
                   [](char c) { return static_cast<unsigned char>(c); });
    return ids;
  }
  thread_local Scratch scratch;
  scratch.cache.claim(impl_->serial);
  // Into the thread's buffer, then one allocation of the exact size: encode_batch keeps
  // millions of these, and fresh memory is what costs there.
  auto& ids = scratch.text_ids;
  ids.clear();
  impl_->encode_text(text, ids, scratch);
  if (!add_special_tokens || impl_->single_template.empty()) return {ids.begin(), ids.end()};
  std::size_t size = 0;
  for (const TemplatePiece& piece : impl_->single_template)
    size += piece.is_sequence ? ids.size() : piece.ids.size();
  std::vector<std::int32_t> templated;
  templated.reserve(size);
  for (const TemplatePiece& piece : impl_->single_template) {
    const auto& from = piece.is_sequence ? ids : piece.ids;
    templated.insert(templated.end(), from.begin(), from.end());
  }
  return templated;
}

std::vector<std::vector<std::int32_t>> Tokenizer::encode_batch(std::span<const std::string> texts,
                                                               bool add_special_tokens,
                                                               int threads) const {
  TY_CHECK(threads >= 0, "encode_batch: threads is ", threads,
           "; give 0 (every usable CPU) or more.");
  std::vector<std::vector<std::int32_t>> out(texts.size());
  // Counted once: encode_lines calls this for every chunk. See Note [Counting CPUs in a
  // container].
  static const int usable_cpus = usable_cpu_count();
  std::size_t workers = threads > 0 ? threads : usable_cpus;
  workers = std::min(workers, std::max<std::size_t>(1, texts.size() / 16));
  // Workers take runs of kRun texts, so no two write next to each other in `out` (false sharing)
  // and a worker with long texts does not hold the others up.
  constexpr std::size_t kRun = 64;
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t begin; (begin = next.fetch_add(kRun)) < texts.size();)
      for (std::size_t i = begin; i < std::min(begin + kRun, texts.size()); ++i)
        out[i] = encode(texts[i], add_special_tokens);
  };
  std::vector<std::thread> pool;
  for (std::size_t w = 1; w < workers; ++w) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  return out;
}

std::string Tokenizer::decode(std::span<const std::int32_t> ids, bool skip_special_tokens) const {
  if (impl_->byte_level) return decode_bytes(ids, skip_special_tokens);
  return impl_->decode(ids, skip_special_tokens, /*lossy=*/true);
}

std::string Tokenizer::decode_bytes(std::span<const std::int32_t> ids,
                                    bool skip_special_tokens) const {
  if (!impl_->byte_level) return impl_->decode(ids, skip_special_tokens, /*lossy=*/false);
  std::string out;
  out.reserve(ids.size());
  for (std::int32_t id : ids)
    if (id >= 0 && id < 256) out.push_back(static_cast<char>(id));
  return out;
}

std::string Tokenizer::normalize(std::string_view text) const {
  Scratch scratch;
  return impl_->normalize_into(text, scratch) ? scratch.normalized : std::string(text);
}

std::int64_t Tokenizer::vocab_size() const {
  return impl_->byte_level ? 256 : static_cast<std::int64_t>(impl_->token_text.size());
}

std::size_t Tokenizer::longest_token_bytes() const {
  if (impl_->byte_level) return 1;
  // A step that deletes text (a Replace with a shorter content or a pattern, a Split that removes
  // its matches) or one <unk> for a run of unknown characters: a text may then have far fewer
  // tokens than its bytes say, so the longest token bounds nothing (0: unknown).
  if (impl_->fuse_unk && !impl_->byte_fallback) return 0;
  for (const auto& step : impl_->normalizers)
    if (const auto* r = std::get_if<internal::ReplaceNormalizer>(&step);
        r != nullptr && (r->regex || r->content.size() < r->literal.size()))
      return 0;
  for (const auto& step : impl_->pre_tokenizers)
    if (const auto* s = std::get_if<internal::SplitPreTokenizer>(&step);
        s != nullptr && s->behavior == internal::SplitBehavior::kRemoved)
      return 0;
  std::size_t longest = 1;
  for (const auto& text : impl_->token_text) longest = std::max(longest, text.size());
  return longest;
}

std::optional<std::int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (impl_->byte_level) {
    if (token.size() == 1) return static_cast<unsigned char>(token[0]);
    return std::nullopt;
  }
  if (const auto it = impl_->added_ids.find(token); it != impl_->added_ids.end()) return it->second;
  if (const auto it = impl_->vocab.find(token); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

std::optional<std::string> Tokenizer::id_to_token(std::int32_t id) const {
  if (impl_->byte_level) {
    if (id >= 0 && id < 256) return std::string(1, static_cast<char>(id));
    return std::nullopt;
  }
  if (id < 0 || id >= vocab_size() || !impl_->token_known[id]) return std::nullopt;
  return impl_->token_text[id];
}

std::optional<std::int32_t> Tokenizer::first_known(
    std::initializer_list<std::string_view> tokens) const {
  for (std::string_view token : tokens)
    if (auto id = token_to_id(token)) return id;
  return std::nullopt;
}

std::optional<std::int32_t> Tokenizer::bos_id() const {
  if (impl_->template_bos) return impl_->template_bos;
  return first_known({"<s>", "<|begin_of_text|>"});
}
std::optional<std::int32_t> Tokenizer::eos_id() const {
  if (impl_->template_eos) return impl_->template_eos;
  return first_known({"<|endoftext|>", "<|end_of_text|>", "</s>"});
}
std::optional<std::int32_t> Tokenizer::pad_id() const {
  return first_known({"<|padding|>", "<pad>", "<|finetune_right_pad_id|>"});
}
bool Tokenizer::is_byte_level() const {
  return impl_->byte_level;
}
const std::string& Tokenizer::source() const {
  return impl_->source;
}

}  // namespace trainyard::hf
