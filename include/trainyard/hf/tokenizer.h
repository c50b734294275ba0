// A Hugging Face `tokenizer.json` tokenizer for BPE models: byte-level BPE as GPT-2, GPT-NeoX,
// Pythia, Llama 3 and Qwen2 ship it (ByteLevel and Split pre-tokenisers), and SentencePiece-style
// BPE as Llama 2, TinyLlama and Mistral ship it ("▁" for spaces, byte_fallback), with added and
// special tokens, TemplateProcessing and the matching decoders. It produces the ids the
// `tokenizers` library produces. Tokenizer::byte_level() is the fallback for models without one.
#pragma once

#include <cstdint>
#include <filesystem>
#include <initializer_list>
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
  // Unigram, Lowercase, ...), and CorruptDataError for malformed JSON or vocabularies.
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
  // (up to 4 MiB a thread; Note [Word cache] in src/hf/bpe.cpp).
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

  // The text after the normaliser (NFC for Pythia, "▁" for spaces for Llama 2); the text itself
  // when there is none.
  std::string normalize(std::string_view text) const;

  // One past the largest id encode() can return (model vocabulary and added tokens; Pythia 50277).
  std::int64_t vocab_size() const;
  // The longest token as the file writes it, in bytes (1 for the byte-level fallback): no token
  // stands for more bytes of text than that, so a text of N bytes has at least about N / this many
  // tokens (see Note [Prompts longer than seq_len] in data/instruction_data.h). 0 when a step may
  // delete text (a Replace to shorter content or by a pattern, a Split that removes its matches,
  // fuse_unk without byte_fallback), so that nothing follows from a text's length.
  std::size_t longest_token_bytes() const;
  // The id of a vocabulary entry or added token, written as the file writes it ("Ġthe").
  std::optional<std::int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(std::int32_t id) const;
  // The special tokens that begin and end a document. BOS: the one token the post-processor's
  // template puts before the text (Llama 2's "<s>", Llama 3's "<|begin_of_text|>"), else the
  // first of those two the vocabulary holds. EOS: the one token the template puts after the text,
  // else the first of "<|endoftext|>" (GPT-NeoX 0, Qwen2), "<|end_of_text|>" (Llama 3) and "</s>"
  // (Llama 2, Mistral). PAD: the first of "<|padding|>" (GPT-NeoX 1), "<pad>" and Llama 3.1's
  // "<|finetune_right_pad_id|>". nullopt when the vocabulary has none of them.
  std::optional<std::int32_t> bos_id() const;
  std::optional<std::int32_t> eos_id() const;
  std::optional<std::int32_t> pad_id() const;

  bool is_byte_level() const;
  // The file it was read from, or "byte-level" for the fallback.
  const std::string& source() const;

  struct Impl;  // opaque outside src/hf/tokenizer.cpp

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::optional<std::int32_t> first_known(std::initializer_list<std::string_view> tokens) const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainyard::hf
