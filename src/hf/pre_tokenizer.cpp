// The pre-tokeniser steps of hf::Tokenizer: ByteLevel (GPT-2's split pattern), Split (a
// pattern, as Llama 3 and Qwen2 split text) and Metaspace (SentencePiece's "▁" for spaces), run
// in order on the pieces between added tokens; the model then encodes each word they leave.
#include <algorithm>
#include <cstddef>
#include <string_view>
#include <vector>

#include "hf/tokenizer_impl.h"

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

// Note [Pre-tokeniser steps]
// HF runs a Sequence of pre-tokenisers one after the other: each takes every piece the previous
// one left and splits it further, dropping empty pieces, and the model encodes each final piece
// as a word. pre_tokenize() recurses over the steps with a piece at a time, so nothing but the
// steps that rewrite text (a prefix space, Metaspace's "▁") copies it; each step keeps its text,
// matches and pieces in the thread's Scratch, one slot per step, as the recursion nests.
// ByteLevel must be the last step: it hands the model bytes, which the vocabulary writes in
// GPT-2's byte-level form (byte_level_words). Split and Metaspace cut a piece as HF's
// NormalizedString::split does (split_by_behavior). Metaspace's prepend_scheme "first" adds
// "▁" only to a piece that begins the text (HF: its original offset is 0), so a piece after an
// added token ("<s>hi") gets none.

namespace trainyard::hf {

using namespace internal;  // NOLINT(google-build-using-namespace): this class's own parts

namespace {

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};

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

// HF's NormalizedString::split: the matches and the gaps between them cover [0, size), and
// `behavior` says what becomes of a match: a piece of its own (Isolated), nothing (Removed), part
// of the piece before or after it (MergedWithPrevious / MergedWithNext), or, for runs of matches
// and runs of gaps, one piece a run (Contiguous). invert swaps the roles of matches and gaps.
void split_by_behavior(std::size_t size,
                       const std::vector<Match>& matches,
                       SplitBehavior behavior,
                       bool invert,
                       std::vector<Match>& pieces) {
  struct Part {
    Match span;
    bool is_match;
  };
  // Few pieces per call; a small local vector is cheaper than threading one more buffer through.
  std::vector<Part> parts;
  parts.reserve(matches.size() * 2 + 1);
  std::size_t previous = 0;
  for (const Match& m : matches) {
    if (previous != m.begin) parts.push_back({{previous, m.begin}, invert});
    parts.push_back({m, !invert});
    previous = m.end;
  }
  if (previous != size) parts.push_back({{previous, size}, invert});

  pieces.clear();
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Part& p : parts) pieces.push_back(p.span);
      break;
    case SplitBehavior::kRemoved:
      for (const Part& p : parts)
        if (!p.is_match) pieces.push_back(p.span);
      break;
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Part& p : parts) {
        if (p.is_match == previous_match && !pieces.empty())
          pieces.back().end = p.span.end;
        else
          pieces.push_back(p.span);
        previous_match = p.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Part& p : parts) {
        if (p.is_match && !previous_match && !pieces.empty())
          pieces.back().end = p.span.end;
        else
          pieces.push_back(p.span);
        previous_match = p.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {  // HF walks from the end
      bool next_match = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->is_match && !next_match && !pieces.empty())
          pieces.back().begin = it->span.begin;
        else
          pieces.push_back(it->span);
        next_match = it->is_match;
      }
      std::reverse(pieces.begin(), pieces.end());
      break;
    }
  }
}

// Every occurrence of `needle` in s, left to right, without overlaps.
void find_literal(std::string_view s, std::string_view needle, std::vector<Match>& out) {
  out.clear();
  if (needle.empty()) return;
  for (std::size_t at = s.find(needle); at != std::string_view::npos;
       at = s.find(needle, at + needle.size()))
    out.push_back({at, at + needle.size()});
}

}  // namespace

void Tokenizer::Impl::pre_tokenize(std::size_t step,
                                   std::string_view piece,
                                   bool at_start,
                                   std::vector<std::int32_t>& ids,
                                   Scratch& scratch) const {
  if (piece.empty()) return;  // HF drops empty pieces
  if (step == pre_tokenizers.size()) {
    encode_word(piece, ids, scratch);
    return;
  }
  if (scratch.steps.size() < pre_tokenizers.size()) scratch.steps.resize(pre_tokenizers.size());
  Scratch::Step& slot = scratch.steps[step];
  // Each piece of `text` (slot.pieces) goes to the next step; `text` begins the parent piece.
  auto hand_on = [&](std::string_view text) {
    for (const Match& p : slot.pieces)
      pre_tokenize(step + 1, text.substr(p.begin, p.end - p.begin), at_start && p.begin == 0, ids,
                   scratch);
  };
  std::visit(
      Overloaded{
          [&](const ByteLevelPreTokenizer& b) {
            if (b.add_prefix_space && piece.front() != ' ') {
              slot.text.assign(" ");
              slot.text.append(piece);
              piece = slot.text;
            }
            if (!b.use_regex) {
              pre_tokenize(step + 1, piece, at_start, ids, scratch);
              return;
            }
            split_gpt2(piece, [&](std::string_view word) {
              pre_tokenize(step + 1, word, at_start && word.data() == piece.data(), ids, scratch);
            });
          },
          [&](const SplitPreTokenizer& s) {
            s.pattern.find_all(piece, slot.matches);
            split_by_behavior(piece.size(), slot.matches, s.behavior, s.invert, slot.pieces);
            hand_on(piece);
          },
          [&](const MetaspacePreTokenizer& m) {
            slot.text.clear();
            const bool prepend = (m.prepend_scheme == PrependScheme::kAlways ||
                                  (m.prepend_scheme == PrependScheme::kFirst && at_start)) &&
                                 !(piece.starts_with(' ') || piece.starts_with(m.replacement));
            if (prepend) slot.text.append(m.replacement);
            for (char c : piece) {  // every U+0020 becomes the replacement
              if (c == ' ')
                slot.text.append(m.replacement);
              else
                slot.text.push_back(c);
            }
            if (!m.split) {
              pre_tokenize(step + 1, slot.text, at_start, ids, scratch);
              return;
            }
            find_literal(slot.text, m.replacement, slot.matches);
            split_by_behavior(slot.text.size(), slot.matches, SplitBehavior::kMergedWithNext, false,
                              slot.pieces);
            hand_on(slot.text);
          }},
      pre_tokenizers[step]);
}

}  // namespace trainyard::hf
