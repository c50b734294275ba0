// Private to src/hf: the parts of hf::Tokenizer that src/hf/tokenizer.cpp (encoding, decoding)
// and src/hf/tokenizer_json.cpp (reading tokenizer.json) share.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "hf/tokenizer_regex.h"
#include "hf/tokenizer_steps.h"
#include "hf/unicode_text.h"
#include "trainyard/hf/tokenizer.h"

namespace trainyard::hf {
namespace internal {

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// GPT-2's byte-level form of raw bytes, as the vocabulary writes tokens ("Ġthe" for " the").
std::string to_byte_level(std::string_view bytes);
// The bytes a token stands for after HF's ByteLevel decoder: each character mapped back to its
// byte, or, when some character is not in the map, the token's own UTF-8.
std::string from_byte_level(std::string_view token);

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

struct Merge {
  std::uint32_t rank;
  std::int32_t id;
};

inline std::uint64_t pair_key(std::int32_t left, std::int32_t right) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) |
         static_cast<std::uint32_t>(right);
}

// One piece of the post-processor's template for a single sequence: the text's ids, or fixed ids.
struct TemplatePiece {
  bool is_sequence = false;
  std::vector<std::int32_t> ids;
};

// A word's ids, remembered per thread: Note [Word cache] in src/hf/bpe.cpp.
class WordCache {
 public:
  static constexpr std::size_t kMaxWordBytes = 22;
  static constexpr std::size_t kMaxIds = 8;
  static constexpr std::size_t kMinSlots = std::size_t{1} << 10;  // 64 KiB
  static constexpr std::size_t kMaxSlots = std::size_t{1} << 16;  // 4 MiB

  // The tokenizer (Impl::serial) whose words it holds; another one's empties it first.
  void claim(std::uint64_t owner);
  // Appends the ids of `word` (whose std::hash is `hash`) to out; false when it is not cached.
  bool find(std::string_view word, std::uint64_t hash, std::vector<std::int32_t>& out) const;
  // Remembers a word's ids, unless either is too long to keep.
  void insert(std::string_view word, std::uint64_t hash, std::span<const std::int32_t> ids);

 private:
  struct alignas(64) Slot {  // one cache line
    std::uint64_t hash;
    std::uint8_t word_length;  // 0: empty
    std::uint8_t id_count;
    char word[kMaxWordBytes];
    std::int32_t ids[kMaxIds];
  };
  void clear();
  void grow();  // doubles the table, keeping its words
  std::vector<Slot> slots_;
  std::size_t used_ = 0;
  std::uint64_t owner_ = 0;
};

// Per-thread buffers, so encoding allocates little once warm.
struct Scratch {
  std::string normalized;
  std::string normalized_step;
  struct Symbol {
    std::int32_t id;
    std::int32_t prev;
    std::int32_t next;
    std::uint32_t length;  // bytes; 0 once merged into its left neighbour
  };
  std::vector<Symbol> symbols;
  struct Candidate {  // a merge waiting in BPE's queue
    std::uint32_t rank;
    std::int32_t pos;
    std::int32_t id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::vector<Candidate> queue;  // a min-heap: lowest rank, then leftmost, first
  std::vector<std::int32_t> word_ids;
  std::vector<std::int32_t> text_ids;
  // Per pre-tokeniser step: the text it rewrote, the pattern's matches and the pieces it made.
  struct Step {
    std::string text;
    std::vector<Match> matches;
    std::vector<Match> pieces;
  };
  std::vector<Step> steps;
  std::string word_text;  // a word in byte-level form, for byte_fallback
  WordCache cache;
};

}  // namespace internal

struct Tokenizer::Impl {
  using AddedToken = internal::AddedToken;
  using AddedTokenTrie = internal::AddedTokenTrie;
  using Scratch = internal::Scratch;
  template <typename V>
  using StringMap = internal::StringMap<V>;

  Impl();

  std::uint64_t serial;  // unique in the process, for the word caches
  std::string source;
  bool byte_level = false;

  // model: BPE over the characters of each word: its bytes' characters when the pre-tokeniser
  // ends in ByteLevel (byte_level_words), else the word's own characters (SentencePiece's BPE).
  StringMap<std::int32_t> vocab;  // as the file writes it: "Ġthe", "▁the"
  std::unordered_map<std::uint64_t, internal::Merge>
      merges;                                // (left id, right id) -> rank, merged id
  std::array<std::int32_t, 256> byte_ids{};  // -1: the byte's character is not in the vocabulary
  std::array<std::int32_t, 256> fallback_ids{};  // byte_fallback's "<0x0A>" ids; -1: none
  std::optional<std::int32_t> unk_id;
  bool fuse_unk = false;
  bool ignore_merges = false;
  bool byte_fallback = false;
  bool byte_level_words = false;  // the last pre-tokeniser step is ByteLevel

  std::vector<internal::NormalizerStep> normalizers;  // applied in order
  std::vector<internal::PreTokenizerStep> pre_tokenizers;

  std::vector<AddedToken> added;
  AddedTokenTrie raw_trie;         // tokens matched before normalisation (normalized: false)
  AddedTokenTrie normalized_trie;  // tokens matched on normalised text
  StringMap<std::int32_t> added_ids;

  std::vector<internal::TemplatePiece> single_template;  // empty: encode() adds nothing
  std::optional<std::int32_t> template_bos;  // the one special token the template puts first
  std::optional<std::int32_t> template_eos;  // the one special token the template puts last

  // decoder: none (HF joins the tokens with spaces), ByteLevel alone (token_bytes), or a chain
  std::vector<internal::DecoderStep> decoders;
  bool has_decoder = false;
  bool byte_level_decoder = false;       // decoders is [ByteLevel]: decode through token_bytes
  std::vector<std::string> token_text;   // by id, as written; empty for ids nothing names
  std::vector<std::string> token_bytes;  // by id, what the ByteLevel decoder emits for it
  std::vector<std::uint8_t> token_special;
  std::vector<std::uint8_t> token_known;

  void encode_text(std::string_view s, std::vector<std::int32_t>& ids, Scratch& scratch) const;
  template <typename OnText>
  void split_added(std::string_view s,
                   const AddedTokenTrie& trie,
                   std::vector<std::int32_t>& ids,
                   OnText&& on_text) const;
  // Runs pre-tokeniser steps [step, end) on a piece, then the model on each word. at_start: the
  // piece begins the text (Metaspace's prepend_scheme "first").
  void pre_tokenize(std::size_t step,
                    std::string_view piece,
                    bool at_start,
                    std::vector<std::int32_t>& ids,
                    Scratch& scratch) const;
  void encode_word(std::string_view word, std::vector<std::int32_t>& ids, Scratch& s) const;
  void bpe(std::string_view word, std::vector<std::int32_t>& ids, Scratch& scratch) const;
  // The word's first symbols: one id per byte of the byte-level form.
  void byte_symbols(std::string_view word, Scratch& scratch) const;
  // The word's first symbols: one id per character, byte_fallback's or unk for unknown ones.
  void char_symbols(std::string_view word, Scratch& scratch) const;
  bool normalize_into(std::string_view s, Scratch& scratch) const;
  // lossy: HF's decode (bytes that are not UTF-8 become U+FFFD); else the bytes themselves.
  std::string decode(std::span<const std::int32_t> ids, bool skip_special, bool lossy) const;
};

}  // namespace trainyard::hf
