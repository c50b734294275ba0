#include "trainyard/hf/tokenizer.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "hf/unicode_text.h"
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
namespace {

using json = nlohmann::json;

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

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

struct AddedToken {
  std::string content;
  std::int32_t id = 0;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
};

// A byte trie over added tokens' contents, for AhoCorasick's leftmost-longest matching.
class AddedTokenTrie {
 public:
  AddedTokenTrie() { root_.fill(-1); }
  void insert(std::string_view pattern, std::int32_t token) {
    if (pattern.empty()) return;
    std::int32_t node = 0;
    for (char c : pattern) {
      const auto b = static_cast<unsigned char>(c);
      std::int32_t child = -1;
      for (const auto& [byte, next] : nodes_[node].children)
        if (byte == b) child = next;
      if (child < 0) {
        child = static_cast<std::int32_t>(nodes_.size());
        nodes_[node].children.emplace_back(b, child);
        nodes_.emplace_back();
        if (node == 0) root_[b] = child;
      }
      node = child;
    }
    if (nodes_[node].token < 0) nodes_[node].token = token;  // the first of equal patterns wins
  }
  bool empty() const { return nodes_.size() == 1; }
  bool may_start(char c) const { return root_[static_cast<unsigned char>(c)] >= 0; }
  // The longest pattern that starts at s[i]: {token, length}, token -1 when none does.
  std::pair<std::int32_t, std::size_t> longest_at(std::string_view s, std::size_t i) const {
    std::pair<std::int32_t, std::size_t> best{-1, 0};
    std::int32_t node = 0;
    for (std::size_t k = i; k < s.size(); ++k) {
      std::int32_t child = -1;
      for (const auto& [byte, next] : nodes_[node].children)
        if (byte == static_cast<unsigned char>(s[k])) child = next;
      if (child < 0) break;
      node = child;
      if (nodes_[node].token >= 0) best = {nodes_[node].token, k + 1 - i};
    }
    return best;
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, std::int32_t>> children;
    std::int32_t token = -1;
  };
  std::vector<Node> nodes_{1};
  std::array<std::int32_t, 256> root_{};
};

// word (raw bytes) -> ids, shared by all threads; sharded so they seldom wait on each other.
class WordCache {
 public:
  static constexpr std::size_t kMaxWordBytes = 128;
  bool find(std::string_view word, std::vector<std::int32_t>& out) const {
    Shard& shard = shard_for(word);
    std::lock_guard<std::mutex> lock(shard.mu);
    const auto it = shard.map.find(word);
    if (it == shard.map.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }
  void insert(std::string_view word, std::span<const std::int32_t> ids) const {
    if (word.size() > kMaxWordBytes) return;
    Shard& shard = shard_for(word);
    std::lock_guard<std::mutex> lock(shard.mu);
    if (shard.map.size() >= kMaxEntriesPerShard) return;  // bounded: a full cache stops growing
    shard.map.emplace(std::string(word), std::vector<std::int32_t>(ids.begin(), ids.end()));
  }

 private:
  static constexpr std::size_t kShards = 64;
  static constexpr std::size_t kMaxEntriesPerShard = std::size_t{1} << 14;  // 1M words in all
  struct Shard {
    std::mutex mu;
    StringMap<std::vector<std::int32_t>> map;
  };
  Shard& shard_for(std::string_view word) const {
    return shards_[std::hash<std::string_view>{}(word) % kShards];
  }
  mutable std::array<Shard, kShards> shards_;
};

struct Merge {
  std::uint32_t rank;
  std::int32_t id;
};

std::uint64_t pair_key(std::int32_t left, std::int32_t right) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) |
         static_cast<std::uint32_t>(right);
}

// One piece of the post-processor's template for a single sequence: the text's ids, or fixed ids.
struct TemplatePiece {
  bool is_sequence = false;
  std::vector<std::int32_t> ids;
};

// Per-thread buffers, so encoding allocates little once warm.
struct Scratch {
  std::string normalized;
  std::string normalized_step;
  std::string prefixed;
  struct Symbol {
    std::int32_t id;
    std::int32_t prev;
    std::int32_t next;
    std::uint32_t length;  // bytes; 0 once merged into its left neighbour
  };
  std::vector<Symbol> symbols;
  std::vector<std::int32_t> word_ids;
};

}  // namespace

struct Tokenizer::Impl {
  std::string source;
  bool byte_level = false;

  // model: BPE over the bytes of each word (each byte is one character of the byte-level form)
  StringMap<std::int32_t> vocab;                    // as the file writes it: "Ġthe"
  std::unordered_map<std::uint64_t, Merge> merges;  // (left id, right id) -> rank, merged id
  std::array<std::int32_t, 256> byte_ids{};  // -1: the byte's character is not in the vocabulary
  std::optional<std::int32_t> unk_id;
  bool fuse_unk = false;
  bool ignore_merges = false;

  std::vector<text::NormalForm> normal_forms;  // applied in order

  bool add_prefix_space = false;
  bool use_regex = true;

  std::vector<AddedToken> added;
  AddedTokenTrie raw_trie;         // tokens matched before normalisation (normalized: false)
  AddedTokenTrie normalized_trie;  // tokens matched on normalised text
  StringMap<std::int32_t> added_ids;

  std::vector<TemplatePiece> single_template;  // empty: encode() adds nothing

  bool byte_level_decoder = true;        // false: no decoder, tokens are joined with spaces (HF)
  std::vector<std::string> token_text;   // by id, as written; empty for ids nothing names
  std::vector<std::string> token_bytes;  // by id, what decode() emits for it
  std::vector<std::uint8_t> token_special;
  std::vector<std::uint8_t> token_known;

  WordCache cache;

  void encode_text(std::string_view s, std::vector<std::int32_t>& ids, Scratch& scratch) const;
  template <typename OnText>
  void split_added(std::string_view s,
                   const AddedTokenTrie& trie,
                   std::vector<std::int32_t>& ids,
                   OnText&& on_text) const;
  void encode_piece(std::string_view piece, std::vector<std::int32_t>& ids, Scratch& s) const;
  void encode_word(std::string_view word, std::vector<std::int32_t>& ids, Scratch& s) const;
  void bpe(std::string_view word, std::vector<std::int32_t>& ids, Scratch& scratch) const;
  bool normalize_into(std::string_view s, Scratch& scratch) const;
  std::string decode(std::span<const std::int32_t> ids, bool skip_special) const;
};

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
  if (cache.find(word, ids)) return;
  scratch.word_ids.clear();
  bpe(word, scratch.word_ids, scratch);
  cache.insert(word, scratch.word_ids);
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

  struct Candidate {
    std::uint32_t rank;
    std::int32_t pos;
    std::int32_t id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto push = [&](std::int32_t pos) {
    const auto it = merges.find(pair_key(symbols[pos].id, symbols[symbols[pos].next].id));
    if (it != merges.end()) queue.push({it->second.rank, pos, it->second.id});
  };
  for (std::size_t i = 0; i + 1 < symbols.size(); ++i) push(static_cast<std::int32_t>(i));
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
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

// --- loading --------------------------------------------------------------------------------

namespace {

// A field's value as a string for messages.
std::string shown(const json& value) {
  return value.dump();
}

// The "type" of one of the file's components; "" for null or a missing component.
std::string type_of(const json& component, const std::string& what, const std::string& field) {
  if (component.is_null()) return "";
  TY_CHECK_T(CorruptDataError,
             component.is_object() && component.contains("type") && component["type"].is_string(),
             what, ": field \"", field, "\" should be an object with a \"type\", not ",
             shown(component).substr(0, 200));
  return component["type"].get<std::string>();
}

[[noreturn]] void unsupported(const std::string& what,
                              const std::string& field,
                              const std::string& value,
                              const std::string& supported) {
  throw InvalidArgumentError(detail::concat(
      what, ": field \"", field, "\" is ", value, ", which trainyard does not implement (",
      supported,
      "). trainyard reads byte-level BPE tokenizers as GPT-2, GPT-NeoX, Pythia and Dolly ship "
      "them. HINT: use a model with such a tokenizer, or remove the directory's tokenizer.json to "
      "fall back to byte-level ids."));
}

bool flag(const json& object, const char* name, bool fallback) {
  const auto it = object.find(name);
  return it == object.end() || it->is_null() ? fallback : it->get<bool>();
}

void load_normalizer(const json& n,
                     const std::string& what,
                     const std::string& field,
                     std::vector<text::NormalForm>& forms) {
  const std::string type = type_of(n, what, field);
  if (type.empty()) return;
  if (type == "NFC")
    forms.push_back(text::NormalForm::kNfc);
  else if (type == "NFD")
    forms.push_back(text::NormalForm::kNfd);
  else if (type == "NFKC")
    forms.push_back(text::NormalForm::kNfkc);
  else if (type == "NFKD")
    forms.push_back(text::NormalForm::kNfkd);
  else if (type == "Sequence") {
    const json& list = n.at("normalizers");
    for (std::size_t i = 0; i < list.size(); ++i)
      load_normalizer(list[i], what, detail::concat(field, ".normalizers[", i, "]"), forms);
  } else {
    unsupported(what, field + ".type", shown(n["type"]), "normalizers: NFC, NFD, NFKC, NFKD");
  }
}

void load_post_processor(const json& p,
                         const std::string& what,
                         const std::string& field,
                         Tokenizer::Impl& impl) {
  const std::string type = type_of(p, what, field);
  if (type.empty() || type == "ByteLevel") return;  // ByteLevel only trims offsets
  if (type == "Sequence") {
    const json& list = p.at("processors");
    for (std::size_t i = 0; i < list.size(); ++i)
      load_post_processor(list[i], what, detail::concat(field, ".processors[", i, "]"), impl);
    return;
  }
  TY_CHECK(impl.single_template.empty(), what, ": field \"", field,
           "\" is a second template; trainyard applies one.");
  if (type == "RobertaProcessing" || type == "BertProcessing") {  // cls A sep
    impl.single_template.push_back({false, {p.at("cls").at(1).get<std::int32_t>()}});
    impl.single_template.push_back({true, {}});
    impl.single_template.push_back({false, {p.at("sep").at(1).get<std::int32_t>()}});
    return;
  }
  if (type != "TemplateProcessing")
    unsupported(what, field + ".type", shown(p["type"]),
                "post-processors: ByteLevel, TemplateProcessing, RobertaProcessing, "
                "BertProcessing, Sequence");
  const json& specials = p.at("special_tokens");
  const json& single = p.at("single");
  for (std::size_t i = 0; i < single.size(); ++i) {
    const json& piece = single[i];
    if (piece.contains("Sequence")) {
      impl.single_template.push_back({true, {}});
    } else if (piece.contains("SpecialToken")) {
      const std::string name = piece["SpecialToken"].at("id").get<std::string>();
      TY_CHECK_T(CorruptDataError, specials.contains(name), what, ": field \"", field, ".single[",
                 i, "]\" names the special token ", shown(name), ", which \"", field,
                 ".special_tokens\" does not list.");
      impl.single_template.push_back(
          {false, specials[name].at("ids").get<std::vector<std::int32_t>>()});
    } else {
      throw CorruptDataError(
          detail::concat(what, ": field \"", field, ".single[", i,
                         "]\" is neither a Sequence nor a SpecialToken: ", shown(piece)));
    }
  }
}

void load_pre_tokenizer(const json& p, const std::string& what, Tokenizer::Impl& impl) {
  const std::string field = "pre_tokenizer";
  std::string type = type_of(p, what, field);
  const json* byte_level = &p;
  if (type == "Sequence" && p.at("pretokenizers").size() == 1) {  // a one-step sequence
    byte_level = &p["pretokenizers"][0];
    type = type_of(*byte_level, what, field + ".pretokenizers[0]");
  }
  if (type != "ByteLevel")
    unsupported(what, field, type.empty() ? "null" : shown(p).substr(0, 200),
                "the pre-tokenizer must be ByteLevel, with GPT-2's split pattern");
  impl.add_prefix_space = flag(*byte_level, "add_prefix_space", true);  // HF's defaults
  impl.use_regex = flag(*byte_level, "use_regex", true);
}

void load_model(const json& m, const std::string& what, Tokenizer::Impl& impl) {
  const std::string type = m.contains("type") ? m["type"].get<std::string>() : "BPE";
  if (type != "BPE") unsupported(what, "model.type", shown(m["type"]), "models: BPE");
  if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0.0)
    unsupported(what, "model.dropout", shown(m["dropout"]), "dropout: null");
  for (const char* name : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(name) && !m[name].is_null() && !m[name].get<std::string>().empty())
      unsupported(what, detail::concat("model.", name), shown(m[name]), "null");
  if (flag(m, "byte_fallback", false))
    unsupported(what, "model.byte_fallback", "true", "byte_fallback: false");
  impl.fuse_unk = flag(m, "fuse_unk", false);
  impl.ignore_merges = flag(m, "ignore_merges", false);

  const json& vocab = m.at("vocab");
  TY_CHECK_T(CorruptDataError, vocab.is_object(), what,
             ": field \"model.vocab\" should map tokens to ids.");
  for (const auto& [token, id] : vocab.items()) {
    TY_CHECK_T(CorruptDataError,
               id.is_number_integer() && id.get<std::int64_t>() >= 0 &&
                   id.get<std::int64_t>() < (std::int64_t{1} << 31),
               what, ": field \"model.vocab\" gives ", shown(token), " the id ", shown(id),
               "; ids are integers from 0.");
    impl.vocab.emplace(token, id.get<std::int32_t>());
  }
  auto id_of = [&](const std::string& token, std::size_t rank) {
    const auto it = impl.vocab.find(token);
    TY_CHECK_T(CorruptDataError, it != impl.vocab.end(), what, ": field \"model.merges[", rank,
               "]\" uses or makes ", shown(token), ", which \"model.vocab\" does not hold.");
    return it->second;
  };
  const json& merges = m.at("merges");
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    std::string left;
    std::string right;
    if (merges[rank].is_string()) {  // "a b"
      const std::string line = merges[rank].get<std::string>();
      const std::size_t space = line.find(' ');
      TY_CHECK_T(CorruptDataError,
                 space != std::string::npos && line.find(' ', space + 1) == std::string::npos, what,
                 ": field \"model.merges[", rank, "]\" is ", shown(line),
                 "; a merge is two tokens with one space between them.");
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else {  // ["a", "b"], as newer files write merges
      TY_CHECK_T(CorruptDataError, merges[rank].is_array() && merges[rank].size() == 2, what,
                 ": field \"model.merges[", rank, "]\" is ", shown(merges[rank]),
                 "; a merge is \"a b\" or [\"a\", \"b\"].");
      left = merges[rank][0].get<std::string>();
      right = merges[rank][1].get<std::string>();
    }
    // A later duplicate replaces an earlier one, as in HF's map.
    impl.merges[pair_key(id_of(left, rank), id_of(right, rank))] =
        Merge{static_cast<std::uint32_t>(rank), id_of(left + right, rank)};
  }
  if (m.contains("unk_token") && !m["unk_token"].is_null()) {
    const auto it = impl.vocab.find(m["unk_token"].get<std::string>());
    TY_CHECK_T(CorruptDataError, it != impl.vocab.end(), what, ": field \"model.unk_token\" is ",
               shown(m["unk_token"]), ", which \"model.vocab\" does not hold.");
    impl.unk_id = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = impl.vocab.find(to_byte_level(std::string(1, static_cast<char>(b))));
    impl.byte_ids[b] = it == impl.vocab.end() ? -1 : it->second;
  }
}

// Note [Added token ids]
// HF does not take an added token's "id" from the file: it adds the tokens one by one in file
// order, as AddedVocabulary::add_tokens does, and warns when the id it gives differs. A token
// whose text is already in the vocabulary (or added before) takes that id; a new one takes the
// model vocabulary's size (the number of entries) or, once an added id reaches it, the largest
// added id + 1. A token equal in every field to one added before is skipped; a later token with
// the same text replaces the earlier one's flags. Pythia's files agree with this everywhere.
void load_added_tokens(const json& list, const std::string& what, Tokenizer::Impl& impl) {
  std::vector<AddedToken> specials;  // in file order, each text once
  std::vector<AddedToken> others;
  std::unordered_set<std::string> special_texts;
  std::unordered_map<std::int32_t, AddedToken> by_id;
  const auto model_size = static_cast<std::int32_t>(impl.vocab.size());
  for (std::size_t i = 0; i < list.size(); ++i) {
    const json& t = list[i];
    AddedToken token;
    token.content = t.at("content").get<std::string>();
    token.special = flag(t, "special", false);
    token.single_word = flag(t, "single_word", false);
    token.lstrip = flag(t, "lstrip", false);
    token.rstrip = flag(t, "rstrip", false);
    token.normalized = flag(t, "normalized", !token.special);
    if (token.special && !token.content.empty() && special_texts.insert(token.content).second)
      specials.push_back(token);
    auto same = [&](const auto& entry) {
      const AddedToken& o = entry.second;
      return o.content == token.content && o.special == token.special &&
             o.single_word == token.single_word && o.lstrip == token.lstrip &&
             o.rstrip == token.rstrip && o.normalized == token.normalized;
    };
    if (token.content.empty() || std::any_of(by_id.begin(), by_id.end(), same)) continue;
    if (const auto it = impl.added_ids.find(token.content); it != impl.added_ids.end()) {
      token.id = it->second;
    } else if (const auto v = impl.vocab.find(token.content); v != impl.vocab.end()) {
      token.id = v->second;
    } else if (impl.added_ids.empty()) {
      token.id = model_size;
    } else {
      std::int32_t largest = 0;
      for (const auto& [text, id] : impl.added_ids) largest = std::max(largest, id);
      token.id = largest >= model_size || model_size == 0 ? largest + 1 : model_size;
    }
    const json& file_id = t.at("id");
    if (!file_id.is_number_integer() || file_id.get<std::int64_t>() != token.id)
      logger("tokenizer")
          ->warn(
              "{}: added_tokens[{}] ({}) says id {}; it gets {} as in HF's "
              "tokenizers (Note [Added token ids])",
              what, i, shown(token.content), shown(file_id), token.id);
    impl.added_ids[token.content] = token.id;
    by_id[token.id] = token;
    if (!special_texts.count(token.content)) others.push_back(token);
  }
  for (const auto& [id, token] : by_id) impl.added.push_back(token);
  std::unordered_map<std::int32_t, std::int32_t> index_of;  // id -> index in impl.added
  for (std::size_t i = 0; i < impl.added.size(); ++i)
    index_of[impl.added[i].id] = static_cast<std::int32_t>(i);
  // HF's matchers: the special tokens first, then the others; the flags are the id's latest.
  Scratch scratch;
  for (const auto* group : {&specials, &others}) {
    for (const AddedToken& token : *group) {
      const std::int32_t index = index_of.at(impl.added_ids.at(token.content));
      if (!token.normalized) {
        impl.raw_trie.insert(token.content, index);
      } else {  // matched in its normalised form
        impl.normalized_trie.insert(impl.normalize_into(token.content, scratch)
                                        ? std::string_view(scratch.normalized)
                                        : std::string_view(token.content),
                                    index);
      }
    }
  }
}

// The id tables decode() and id_to_token() read; added tokens take precedence, as in HF.
void build_id_tables(Tokenizer::Impl& impl) {
  std::int64_t size = 0;
  for (const auto& [token, id] : impl.vocab) size = std::max<std::int64_t>(size, id + 1);
  for (const auto& token : impl.added) size = std::max<std::int64_t>(size, token.id + 1);
  impl.token_text.assign(size, "");
  impl.token_known.assign(size, 0);
  impl.token_special.assign(size, 0);
  for (const auto& [token, id] : impl.vocab) {
    impl.token_text[id] = token;
    impl.token_known[id] = 1;
  }
  std::unordered_set<std::string> specials;
  Scratch scratch;
  for (const auto& token : impl.added) {
    // HF names a normalised token by its normalised text ("e\u0301" reads back as "é").
    impl.token_text[token.id] = token.normalized && impl.normalize_into(token.content, scratch)
                                    ? scratch.normalized
                                    : token.content;
    impl.token_known[token.id] = 1;
    if (token.special) specials.insert(token.content);
  }
  impl.token_bytes.resize(size);
  for (std::int64_t id = 0; id < size; ++id) {
    impl.token_special[id] = specials.count(impl.token_text[id]) > 0;
    impl.token_bytes[id] =
        impl.byte_level_decoder ? from_byte_level(impl.token_text[id]) : impl.token_text[id];
  }
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_json(std::string_view json_text, const std::string& what) {
  auto impl = std::make_unique<Impl>();
  impl->source = what;
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    throw CorruptDataError(detail::concat(what, " is not valid JSON: ", e.what()));
  }
  TY_CHECK_T(CorruptDataError, root.is_object() && root.contains("model"), what,
             " is not a Hugging Face tokenizer.json: it has no \"model\" field.");
  try {
    for (const char* field : {"truncation", "padding"})
      if (root.contains(field) && !root[field].is_null())
        unsupported(what, field, shown(root[field]).substr(0, 200),
                    "null: trainyard encodes whole texts and batches them itself");
    load_model(root["model"], what, *impl);
    if (root.contains("normalizer"))
      load_normalizer(root["normalizer"], what, "normalizer", impl->normal_forms);
    load_pre_tokenizer(root.value("pre_tokenizer", json()), what, *impl);
    if (root.contains("post_processor"))
      load_post_processor(root["post_processor"], what, "post_processor", *impl);
    const std::string decoder = type_of(root.value("decoder", json()), what, "decoder");
    if (!decoder.empty() && decoder != "ByteLevel")
      unsupported(what, "decoder.type", shown(root["decoder"]["type"]), "decoders: ByteLevel");
    impl->byte_level_decoder = !decoder.empty();
    if (root.contains("added_tokens") && !root["added_tokens"].is_null())
      load_added_tokens(root["added_tokens"], what, *impl);
  } catch (const json::exception& e) {  // a field of the wrong type or missing
    throw CorruptDataError(
        detail::concat(what, " is not a tokenizer.json trainyard can read: ", e.what()));
  }
  build_id_tables(*impl);
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  TY_CHECK(in.good(), "Cannot read the tokenizer file ", path.string(), ": ", std::strerror(errno),
           ".");
  std::ostringstream text;
  text << in.rdbuf();
  return from_json(text.str(), path.string());
}

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
  std::vector<std::int32_t> ids;
  if (impl_->byte_level) {
    ids.reserve(text.size());
    for (char c : text) ids.push_back(static_cast<unsigned char>(c));
    return ids;
  }
  thread_local Scratch scratch;
  ids.reserve(text.size() / 3);
  impl_->encode_text(text, ids, scratch);
  if (!add_special_tokens || impl_->single_template.empty()) return ids;
  std::vector<std::int32_t> templated;
  templated.reserve(ids.size() + 4);
  for (const TemplatePiece& piece : impl_->single_template) {
    const auto& from = piece.is_sequence ? ids : piece.ids;
    templated.insert(templated.end(), from.begin(), from.end());
  }
  return templated;
}

std::vector<std::vector<std::int32_t>> Tokenizer::encode_batch(std::span<const std::string> texts,
                                                               bool add_special_tokens,
                                                               int threads) const {
  TY_CHECK(threads >= 0, "encode_batch: threads is ", threads, "; give 0 (all cores) or more.");
  std::vector<std::vector<std::int32_t>> out(texts.size());
  std::size_t workers = threads > 0 ? threads : std::max(1u, std::thread::hardware_concurrency());
  workers = std::min(workers, std::max<std::size_t>(1, texts.size() / 16));
  auto work = [&](std::size_t w) {
    for (std::size_t i = w; i < texts.size(); i += workers)
      out[i] = encode(texts[i], add_special_tokens);
  };
  std::vector<std::thread> pool;
  for (std::size_t w = 1; w < workers; ++w) pool.emplace_back(work, w);
  work(0);
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
