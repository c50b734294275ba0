#include "trainyard/hf/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <functional>
#include <thread>

#include "hf/tokenizer_impl.h"
#include "trainyard/cpu_count.h"
#include "trainyard/error.h"
#include "trainyard/log.h"

// Note [Invalid UTF-8]
// HF's tokenizers take Rust strings, which are always well-formed UTF-8, so HF has no answer for
// other bytes. A training corpus can still hold some, and dropping a document for one stray byte
// is worse than keeping it, so encode() takes any bytes: a byte that starts no well-formed
// sequence counts as one character of its own in the class "neither letter, number nor space",
// passes through normalisation untouched, and is encoded by its byte-level token like any other
// byte. decode_bytes() gives the bytes back; decode() replaces them with U+FFFD as HF would.

// Note [GPT-2 split pattern]
// The ByteLevel pre-tokeniser splits text with
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// compiled by Oniguruma, which tries the alternatives in order at each position, leftmost first.
// split_gpt2() is that regex as a scanner: the classes L, N, space and other partition the
// characters, so at any position exactly one of the letter / number / other alternatives can
// match, optionally led by one U+0020. A run of white space followed by more text leaves its last
// character to the text ("\s+(?!\S)" backtracks one character), so " world" keeps its space;
// a single white-space character before text that is not U+0020 ("\n" before "a") stands alone
// ("\s+"). Every character matches some alternative, so the pieces cover the text.

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

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
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

// Note [Word cache]
// Most words recur, so each thread remembers the ids of the words it has encoded: a table of
// 64-byte slots with open addressing, each holding a word of up to 22 bytes and up to 8 ids
// inline, so a hit reads one cache line. Longer words are encoded every time; they are rare. A
// table 70 % full doubles, from 64 KiB (short texts stay cheap) to 4 MiB; a full 4 MiB table is
// emptied and refills with the words that recur. The table lives in the
// thread's Scratch: threads never share it or lock, and it is tagged with the tokenizer's serial
// number, so a tokenizer never sees another's words (a thread that alternates between two
// tokenizers empties it at every switch: correct, only slower).

void WordCache::claim(std::uint64_t owner) {
  if (owner_ == owner && !slots_.empty()) return;
  slots_.assign(kMinSlots, Slot{});
  used_ = 0;
  owner_ = owner;
}

void WordCache::clear() {
  std::memset(static_cast<void*>(slots_.data()), 0, slots_.size() * sizeof(Slot));
  used_ = 0;
}

void WordCache::grow() {
  std::vector<Slot> old(slots_.size() * 2);
  std::swap(old, slots_);
  const std::size_t mask = slots_.size() - 1;
  for (const Slot& slot : old) {
    if (slot.word_length == 0) continue;
    std::size_t i = slot.hash & mask;
    while (slots_[i].word_length != 0) i = (i + 1) & mask;
    slots_[i] = slot;
  }
}

bool WordCache::find(std::string_view word,
                     std::uint64_t hash,
                     std::vector<std::int32_t>& out) const {
  if (word.size() > kMaxWordBytes || slots_.empty()) return false;
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = hash & mask;; i = (i + 1) & mask) {
    const Slot& slot = slots_[i];
    if (slot.word_length == 0) return false;
    if (slot.hash == hash && slot.word_length == word.size() &&
        std::memcmp(slot.word, word.data(), word.size()) == 0) {
      out.insert(out.end(), slot.ids, slot.ids + slot.id_count);
      return true;
    }
  }
}

void WordCache::insert(std::string_view word,
                       std::uint64_t hash,
                       std::span<const std::int32_t> ids) {
  if (word.size() > kMaxWordBytes || ids.size() > kMaxIds || slots_.empty()) return;
  if (used_ >= slots_.size() / 10 * 7) {  // 70 % full
    if (slots_.size() < kMaxSlots)
      grow();
    else
      clear();
  }
  const std::size_t mask = slots_.size() - 1;
  std::size_t i = hash & mask;
  while (slots_[i].word_length != 0) i = (i + 1) & mask;
  Slot& slot = slots_[i];
  slot.hash = hash;
  slot.word_length = static_cast<std::uint8_t>(word.size());
  slot.id_count = static_cast<std::uint8_t>(ids.size());
  std::memcpy(slot.word, word.data(), word.size());
  std::copy(ids.begin(), ids.end(), slot.ids);
  ++used_;
}

namespace {
std::atomic<std::uint64_t> next_serial{1};
}  // namespace

Tokenizer::Impl::Impl() : serial(next_serial++) {}

namespace {

// Calls emit(piece) for each match of GPT-2's pattern in s, in order: Note [GPT-2 split pattern].
template <typename Emit>
void split_gpt2(std::string_view s, Emit&& emit) {
  using text::CharClass;
  const std::size_t n = s.size();
  auto run_end = [&](std::size_t j, CharClass cls) {
    while (j < n) {
      const text::Char c = text::char_at(s, j);
      if (c.cls != cls) break;
      j += c.length;
    }
    return j;
  };
  std::size_t i = 0;
  while (i < n) {
    if (s[i] == '\'' && i + 1 < n) {  // 's 't 'm 'd 're 've 'll, lower case only
      const char a = s[i + 1];
      std::size_t length = 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd')
        length = 2;
      else if (i + 2 < n && ((a == 'r' && s[i + 2] == 'e') || (a == 'v' && s[i + 2] == 'e') ||
                             (a == 'l' && s[i + 2] == 'l')))
        length = 3;
      if (length > 0) {
        emit(s.substr(i, length));
        i += length;
        continue;
      }
    }
    CharClass cls = text::char_at(s, i).cls;
    std::size_t body = i;
    if (s[i] == ' ' && i + 1 < n) {
      const CharClass next = text::char_at(s, i + 1).cls;
      if (next != CharClass::kSpace) {
        cls = next;
        body = i + 1;
      }
    }
    std::size_t end = 0;
    if (cls != CharClass::kSpace) {
      end = run_end(body, cls);
    } else {
      std::size_t last = i;  // where the run's last character starts
      end = i;
      while (end < n) {
        const text::Char c = text::char_at(s, end);
        if (c.cls != CharClass::kSpace) break;
        last = end;
        end += c.length;
      }
      if (end < n && last > i) end = last;
    }
    emit(s.substr(i, end - i));
    i = end;
  }
}

}  // namespace

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

bool Tokenizer::Impl::normalize_into(std::string_view s, Scratch& scratch) const {
  bool changed = false;
  for (text::NormalForm form : normal_forms) {
    scratch.normalized_step.clear();
    if (!text::normalize(form, changed ? std::string_view(scratch.normalized) : s,
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
  split_added(s, raw_trie, ids, [&](std::string_view piece) {
    const std::string_view normalized =
        normalize_into(piece, scratch) ? std::string_view(scratch.normalized) : piece;
    split_added(normalized, normalized_trie, ids,
                [&](std::string_view rest) { encode_piece(rest, ids, scratch); });
  });
}

void Tokenizer::Impl::encode_piece(std::string_view piece,
                                   std::vector<std::int32_t>& ids,
                                   Scratch& scratch) const {
  if (add_prefix_space && piece.front() != ' ') {  // each piece between added tokens gets one
    scratch.prefixed.assign(" ");
    scratch.prefixed.append(piece);
    piece = scratch.prefixed;
  }
  if (!use_regex) {
    encode_word(piece, ids, scratch);
    return;
  }
  split_gpt2(piece, [&](std::string_view word) { encode_word(word, ids, scratch); });
}

void Tokenizer::Impl::encode_word(std::string_view word,
                                  std::vector<std::int32_t>& ids,
                                  Scratch& scratch) const {
  const std::uint64_t hash = std::hash<std::string_view>{}(word);
  if (scratch.cache.find(word, hash, ids)) return;
  scratch.word_ids.clear();
  bpe(word, scratch.word_ids, scratch);
  scratch.cache.insert(word, hash, scratch.word_ids);
  ids.insert(ids.end(), scratch.word_ids.begin(), scratch.word_ids.end());
}

// HF's BPE::merge_word and Word::merge_all: the pair of lowest rank is merged first, the leftmost
// of equal ranks first, until no adjacent pair has a merge.
void Tokenizer::Impl::bpe(std::string_view word,
                          std::vector<std::int32_t>& ids,
                          Scratch& scratch) const {
  if (ignore_merges) {
    const auto it = vocab.find(to_byte_level(word));
    if (it != vocab.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  auto& symbols = scratch.symbols;
  symbols.clear();
  bool pending_unk = false;  // an unknown character waits to be fused with the next one
  std::uint32_t unk_length = 0;
  auto add = [&](std::int32_t id, std::uint32_t length) {
    const auto index = static_cast<std::int32_t>(symbols.size());
    symbols.push_back({id, index - 1, -1, length});
    if (index > 0) symbols[index - 1].next = index;
  };
  for (char c : word) {
    const std::int32_t id = byte_ids[static_cast<unsigned char>(c)];
    if (id >= 0) {
      if (pending_unk) add(*unk_id, unk_length);
      pending_unk = false;
      add(id, 1);
    } else if (unk_id) {  // without an unknown token HF drops the character
      if (pending_unk && !fuse_unk) add(*unk_id, unk_length);
      unk_length = pending_unk && fuse_unk ? unk_length + 1 : 1;
      pending_unk = true;
    }
  }
  if (pending_unk) add(*unk_id, unk_length);

  auto& queue = scratch.queue;
  queue.clear();
  auto push = [&](std::int32_t pos) {
    const auto it = merges.find(pair_key(symbols[pos].id, symbols[symbols[pos].next].id));
    if (it == merges.end()) return;
    queue.push_back({it->second.rank, pos, it->second.id});
    std::push_heap(queue.begin(), queue.end(), std::greater<>());
  };
  for (std::size_t i = 0; i + 1 < symbols.size(); ++i) push(static_cast<std::int32_t>(i));
  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), std::greater<>());
    const Scratch::Candidate top = queue.back();
    queue.pop_back();
    auto& left = symbols[top.pos];
    if (left.length == 0 || left.next < 0) continue;
    auto& right = symbols[left.next];
    const auto it = merges.find(pair_key(left.id, right.id));
    if (it == merges.end() || it->second.id != top.id) continue;  // a stale entry
    left.id = top.id;
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) push(left.prev);
    if (left.next >= 0) push(top.pos);
  }
  for (const auto& symbol : symbols)
    if (symbol.length > 0) ids.push_back(symbol.id);
}

std::string Tokenizer::Impl::decode(std::span<const std::int32_t> ids, bool skip_special) const {
  std::string out;
  bool first = true;
  for (std::int32_t id : ids) {
    if (id < 0 || static_cast<std::size_t>(id) >= token_known.size() || !token_known[id]) continue;
    if (skip_special && token_special[id]) continue;
    if (!byte_level_decoder && !first) out.push_back(' ');
    out.append(token_bytes[id]);
    first = false;
  }
  return out;
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
  const std::string bytes = impl_->decode(ids, skip_special_tokens);
  std::string out;
  out.reserve(bytes.size());
  text::append_lossy(out, bytes);
  return out;
}

std::string Tokenizer::decode_bytes(std::span<const std::int32_t> ids,
                                    bool skip_special_tokens) const {
  if (!impl_->byte_level) return impl_->decode(ids, skip_special_tokens);
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

std::optional<std::int32_t> Tokenizer::eos_id() const {
  return token_to_id("<|endoftext|>");
}
std::optional<std::int32_t> Tokenizer::pad_id() const {
  return token_to_id("<|padding|>");
}
bool Tokenizer::is_byte_level() const {
  return impl_->byte_level;
}
const std::string& Tokenizer::source() const {
  return impl_->source;
}

}  // namespace trainyard::hf
