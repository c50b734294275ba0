// A Hugging Face `tokenizer.json` tokenizer for byte-level BPE models (GPT-2, GPT-NeoX, Pythia,
// Dolly): NFC normaliser, added and special tokens, ByteLevel pre-tokeniser with GPT-2's split
// pattern, merges by rank, TemplateProcessing and the ByteLevel decoder. It produces the ids the
// `tokenizers` library produces. Tokenizer::byte_level() is the fallback for models without one.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace trainyard::hf {

// The file a model directory holds its tokenizer in, as Hugging Face names it.
inline constexpr std::string_view kTokenizerFileName = "tokenizer.json";

// What encode() does with input that is not valid UTF-8 (HF's Rust API cannot take any):
// see Note [Invalid UTF-8] in src/hf/tokenizer.cpp.
class Tokenizer {
 public:
  // Parses a tokenizer.json. Throws InvalidArgumentError naming the file and the field for a
  // model, normaliser, pre-tokeniser, post-processor or decoder it does not implement (WordPiece,
  // Unigram, a custom split pattern, ...), and CorruptDataError for malformed JSON or vocabularies.
  static Tokenizer from_file(const std::filesystem::path& path);
  // The same from the file's text; `what` names the source in error messages.
  static Tokenizer from_json(std::string_view json_text, const std::string& what);
  // DIR/tokenizer.json when the directory has one, else byte_level().
  static Tokenizer from_directory(const std::filesystem::path& dir);
  // The fallback: ids are the 256 byte values and decode() is the exact inverse of encode().
  static Tokenizer byte_level();

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // The ids HF's `Tokenizer.encode(text, add_special_tokens).ids` gives for UTF-8 `text`
  // (tokenizers 0.23; not for the characters Unicode 16 added, which ICU 72 does not know: see
  // Note [Unicode versions] in src/hf/unicode_text.cpp).
  // add_special_tokens applies the post-processor's template (Pythia's adds nothing).
  // Thread-safe: any number of threads may encode at once, each with a word cache of its own
  // (up to 4 MiB a thread; Note [Word cache] in src/hf/tokenizer.cpp).
  std::vector<std::int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // encode() on each text, spread over `threads` threads (0: usable_cpu_count(), the CPUs this
  // process may use); the result's i-th entry belongs to texts[i]. Blocks until all are done.
  std::vector<std::vector<std::int32_t>> encode_batch(std::span<const std::string> texts,
                                                      bool add_special_tokens = true,
                                                      int threads = 0) const;

  // HF's `Tokenizer.decode(ids, skip_special_tokens)`: ids it does not know are dropped, and bytes
  // that do not form UTF-8 (a character cut between ids) become U+FFFD as Rust's
  // String::from_utf8_lossy makes them. byte_level(): the bytes themselves, unreplaced.
  std::string decode(std::span<const std::int32_t> ids, bool skip_special_tokens = false) const;
  // decode() without the U+FFFD replacement: the bytes the ids stand for.
  std::string decode_bytes(std::span<const std::int32_t> ids,
                           bool skip_special_tokens = false) const;

  // The text after the normaliser (NFC for Pythia); the text itself when there is none.
  std::string normalize(std::string_view text) const;

  // One past the largest id encode() can return (model vocabulary and added tokens; Pythia 50277).
  std::int64_t vocab_size() const;
  // The id of a vocabulary entry or added token, written as the file writes it ("Ġthe").
  std::optional<std::int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(std::int32_t id) const;
  // "<|endoftext|>" and "<|padding|>" (GPT-NeoX: 0 and 1) when the vocabulary has them.
  std::optional<std::int32_t> eos_id() const;
  std::optional<std::int32_t> pad_id() const;

  bool is_byte_level() const;
  // The file it was read from, or "byte-level" for the fallback.
  const std::string& source() const;

  struct Impl;  // opaque outside src/hf/tokenizer.cpp

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainyard::hf
