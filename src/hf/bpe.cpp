// hf::Tokenizer's model: BPE with merges by rank over a word's bytes (GPT-2's byte-level form)
// or characters (SentencePiece's BPE, with byte_fallback), and the per-thread word cache.
#include <algorithm>
#include <cstring>
#include <functional>

#include "hf/tokenizer_impl.h"

namespace trainyard::hf {
namespace internal {

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

}  // namespace internal

using namespace internal;  // NOLINT(google-build-using-namespace): this class's own parts

namespace {

void add_symbol(std::vector<Scratch::Symbol>& symbols, std::int32_t id, std::uint32_t length) {
  const auto index = static_cast<std::int32_t>(symbols.size());
  symbols.push_back({id, index - 1, -1, length});
  if (index > 0) symbols[index - 1].next = index;
}

}  // namespace

void Tokenizer::Impl::byte_symbols(std::string_view word, Scratch& scratch) const {
  auto& symbols = scratch.symbols;
  symbols.clear();
  bool pending_unk = false;  // an unknown character waits to be fused with the next one
  std::uint32_t unk_length = 0;
  for (char c : word) {
    const std::int32_t id = byte_ids[static_cast<unsigned char>(c)];
    if (id >= 0) {
      if (pending_unk) add_symbol(symbols, *unk_id, unk_length);
      pending_unk = false;
      add_symbol(symbols, id, 1);
    } else if (unk_id) {  // without an unknown token HF drops the character
      if (pending_unk && !fuse_unk) add_symbol(symbols, *unk_id, unk_length);
      unk_length = pending_unk && fuse_unk ? unk_length + 1 : 1;
      pending_unk = true;
    }
  }
  if (pending_unk) add_symbol(symbols, *unk_id, unk_length);
}

// Note [Byte fallback]
// A character the vocabulary lacks becomes, under byte_fallback, the tokens of its UTF-8 bytes
// ("<0xE4>" "<0xB8>" "<0xAD>" for "中"), when the vocabulary has all of them; otherwise it is the
// unknown token, fused with unknown neighbours under fuse_unk, or, without one, dropped. As in
// HF's BPE::merge_word, byte tokens do not end a run of unknown characters: an unknown character
// that waits to be fused stays pending across them (HF's order, though it moves the unknown token
// after the bytes; only a vocabulary that lacks some "<0x..>" token can show it).
void Tokenizer::Impl::char_symbols(std::string_view word, Scratch& scratch) const {
  auto& symbols = scratch.symbols;
  symbols.clear();
  bool pending_unk = false;
  std::uint32_t unk_length = 0;
  for (std::size_t i = 0; i < word.size();) {
    const int length = std::max(1, text::sequence_length(word, i));  // Note [Invalid UTF-8]
    const std::string_view c = word.substr(i, length);
    i += length;
    if (const auto it = vocab.find(c); it != vocab.end()) {
      if (pending_unk) add_symbol(symbols, *unk_id, unk_length);
      pending_unk = false;
      add_symbol(symbols, it->second, static_cast<std::uint32_t>(length));
      continue;
    }
    if (byte_fallback && std::all_of(c.begin(), c.end(), [&](char b) {
          return fallback_ids[static_cast<unsigned char>(b)] >= 0;
        })) {
      for (char b : c) add_symbol(symbols, fallback_ids[static_cast<unsigned char>(b)], 1);
      continue;  // See Note [Byte fallback]
    }
    if (!unk_id) continue;
    if (pending_unk && !fuse_unk) add_symbol(symbols, *unk_id, unk_length);
    unk_length = (pending_unk && fuse_unk ? unk_length : 0) + static_cast<std::uint32_t>(length);
    pending_unk = true;
  }
  if (pending_unk) add_symbol(symbols, *unk_id, unk_length);
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

// HF's BPE::merge_word and Word::merge_all: the word's characters become symbols
// (byte_symbols, char_symbols), then the pair of lowest rank is merged first, the leftmost of
// equal ranks first, until no adjacent pair has a merge.
void Tokenizer::Impl::bpe(std::string_view word,
                          std::vector<std::int32_t>& ids,
                          Scratch& scratch) const {
  if (ignore_merges) {  // a word the vocabulary holds is one token (Llama 3)
    const auto it = byte_level_words ? vocab.find(to_byte_level(word)) : vocab.find(word);
    if (it != vocab.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  if (byte_level_words && !byte_fallback) {
    byte_symbols(word, scratch);
  } else if (byte_level_words) {  // byte_fallback reads the byte-level form's UTF-8
    scratch.word_text = to_byte_level(word);
    char_symbols(scratch.word_text, scratch);
  } else {
    char_symbols(word, scratch);
  }
  auto& symbols = scratch.symbols;
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

}  // namespace trainyard::hf
