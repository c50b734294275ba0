// Reading a Hugging Face tokenizer.json into hf::Tokenizer: the model, normaliser, pre-tokeniser,
// post-processor, decoder and added tokens, each checked against what trainyard implements.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_set>

#include "hf/tokenizer_impl.h"
#include "trainyard/error.h"
#include "trainyard/log.h"

namespace trainyard::hf {

using namespace internal;  // NOLINT(google-build-using-namespace): this class's own parts

namespace {

using json = nlohmann::json;

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
  throw InvalidArgumentError(trainyard::detail::concat(
      what, ": field \"", field, "\" is ", value, ", which trainyard does not implement (",
      supported,
      "). trainyard reads BPE tokenizers as GPT-2, GPT-NeoX/Pythia, Llama 2 and 3, Mistral and "
      "Qwen2 ship them. HINT: use a model with such a tokenizer, or remove the directory's "
      "tokenizer.json to fall back to byte-level ids."));
}

bool flag(const json& object, const char* name, bool fallback) {
  const auto it = object.find(name);
  return it == object.end() || it->is_null() ? fallback : it->get<bool>();
}

// A {"String": text} or {"Regex": pattern} field: literal text, or a compiled pattern.
struct PatternField {
  std::string literal;
  std::optional<Regex> regex;
};

PatternField load_pattern(const json& p, const std::string& what, const std::string& field) {
  if (p.is_object() && p.contains("String")) return {p["String"].get<std::string>(), std::nullopt};
  if (p.is_object() && p.contains("Regex"))
    return {"", Regex(p["Regex"].get<std::string>(), false,
                      trainyard::detail::concat(what, ": field \"", field, "\""))};
  throw CorruptDataError(trainyard::detail::concat(
      what, ": field \"", field, "\" should be {\"String\": ...} or {\"Regex\": ...}, not ",
      shown(p).substr(0, 200)));
}

void load_normalizer(const json& n,
                     const std::string& what,
                     const std::string& field,
                     std::vector<NormalizerStep>& steps) {
  const std::string type = type_of(n, what, field);
  if (type.empty()) return;
  if (type == "NFC") {
    steps.emplace_back(text::NormalForm::kNfc);
  } else if (type == "NFD") {
    steps.emplace_back(text::NormalForm::kNfd);
  } else if (type == "NFKC") {
    steps.emplace_back(text::NormalForm::kNfkc);
  } else if (type == "NFKD") {
    steps.emplace_back(text::NormalForm::kNfkd);
  } else if (type == "Prepend") {  // Llama 2: "▁" before the text
    steps.emplace_back(PrependNormalizer{n.at("prepend").get<std::string>()});
  } else if (type == "Replace") {  // Llama 2: " " -> "▁"
    PatternField pattern = load_pattern(n.at("pattern"), what, field + ".pattern");
    steps.emplace_back(ReplaceNormalizer{std::move(pattern.literal), std::move(pattern.regex),
                                         n.at("content").get<std::string>()});
  } else if (type == "Sequence") {
    const json& list = n.at("normalizers");
    for (std::size_t i = 0; i < list.size(); ++i)
      load_normalizer(list[i], what, trainyard::detail::concat(field, ".normalizers[", i, "]"),
                      steps);
  } else {
    unsupported(what, field + ".type", shown(n["type"]),
                "normalizers: NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence");
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
      load_post_processor(list[i], what, trainyard::detail::concat(field, ".processors[", i, "]"),
                          impl);
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
      throw CorruptDataError(trainyard::detail::concat(
          what, ": field \"", field, ".single[", i,
          "]\" is neither a Sequence nor a SpecialToken: ", shown(piece)));
    }
  }
  // One special token before the text is its BOS ("<s>", "<|begin_of_text|>"); one after, EOS.
  const auto& t = impl.single_template;
  if (t.size() >= 2 && !t.front().is_sequence && t.front().ids.size() == 1 && t[1].is_sequence)
    impl.template_bos = t.front().ids[0];
  if (t.size() >= 2 && !t.back().is_sequence && t.back().ids.size() == 1 &&
      t[t.size() - 2].is_sequence)
    impl.template_eos = t.back().ids[0];
}

PrependScheme load_prepend_scheme(const json& m,
                                  const std::string& what,
                                  const std::string& field) {
  if (m.contains("prepend_scheme") && !m["prepend_scheme"].is_null()) {
    const std::string scheme = m["prepend_scheme"].get<std::string>();
    if (scheme == "first") return PrependScheme::kFirst;
    if (scheme == "always") return PrependScheme::kAlways;
    if (scheme == "never") return PrependScheme::kNever;
    unsupported(what, field + ".prepend_scheme", shown(m["prepend_scheme"]),
                "\"first\", \"always\", \"never\"");
  }
  // Files older than prepend_scheme say add_prefix_space.
  return flag(m, "add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
}

std::string load_replacement(const json& m, const std::string& what, const std::string& field) {
  const std::string replacement = m.value("replacement", std::string("\u2581"));
  TY_CHECK_T(CorruptDataError,
             !replacement.empty() &&
                 text::sequence_length(replacement, 0) == static_cast<int>(replacement.size()),
             what, ": field \"", field, ".replacement\" is ", shown(replacement),
             "; it should be one character.");
  return replacement;
}

SplitBehavior load_split_behavior(const json& b,
                                  const std::string& what,
                                  const std::string& field) {
  const std::string name = b.get<std::string>();
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  unsupported(what, field, shown(b),
              "Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
}

// See Note [Pre-tokeniser steps] in src/hf/pre_tokenizer.cpp.
void load_pre_tokenizer(const json& p,
                        const std::string& what,
                        const std::string& field,
                        std::vector<PreTokenizerStep>& steps) {
  const std::string type = type_of(p, what, field);
  if (type.empty()) return;
  if (type == "Sequence") {
    const json& list = p.at("pretokenizers");
    for (std::size_t i = 0; i < list.size(); ++i)
      load_pre_tokenizer(list[i], what, trainyard::detail::concat(field, ".pretokenizers[", i, "]"),
                         steps);
  } else if (type == "ByteLevel") {
    steps.emplace_back(ByteLevelPreTokenizer{.add_prefix_space = flag(p, "add_prefix_space", true),
                                             .use_regex = flag(p, "use_regex", true)});
  } else if (type == "Split") {
    PatternField pattern = load_pattern(p.at("pattern"), what, field + ".pattern");
    steps.emplace_back(SplitPreTokenizer{
        .pattern = pattern.regex ? std::move(*pattern.regex)
                                 : Regex(pattern.literal, /*literal=*/true, what),
        .behavior = load_split_behavior(p.at("behavior"), what, field + ".behavior"),
        .invert = flag(p, "invert", false)});
  } else if (type == "Metaspace") {
    steps.emplace_back(MetaspacePreTokenizer{.replacement = load_replacement(p, what, field),
                                             .prepend_scheme = load_prepend_scheme(p, what, field),
                                             .split = flag(p, "split", true)});
  } else {
    unsupported(what, field + ".type", shown(p["type"]),
                "pre-tokenizers: ByteLevel, Split, Metaspace, Sequence");
  }
}

// See Note [Decoder chain] in src/hf/decoder.cpp.
void load_decoder(const json& d,
                  const std::string& what,
                  const std::string& field,
                  std::vector<DecoderStep>& steps) {
  const std::string type = type_of(d, what, field);
  if (type.empty()) return;
  if (type == "Sequence") {
    const json& list = d.at("decoders");
    for (std::size_t i = 0; i < list.size(); ++i)
      load_decoder(list[i], what, trainyard::detail::concat(field, ".decoders[", i, "]"), steps);
  } else if (type == "ByteLevel") {
    steps.emplace_back(ByteLevelDecoder{});
  } else if (type == "Replace") {
    PatternField pattern = load_pattern(d.at("pattern"), what, field + ".pattern");
    steps.emplace_back(ReplaceDecoder{std::move(pattern.literal), std::move(pattern.regex),
                                      d.at("content").get<std::string>()});
  } else if (type == "ByteFallback") {
    steps.emplace_back(ByteFallbackDecoder{});
  } else if (type == "Fuse") {
    steps.emplace_back(FuseDecoder{});
  } else if (type == "Strip") {
    const std::string content = d.at("content").get<std::string>();
    TY_CHECK_T(
        CorruptDataError,
        !content.empty() && text::sequence_length(content, 0) == static_cast<int>(content.size()),
        what, ": field \"", field, ".content\" is ", shown(content),
        "; it should be one character.");
    steps.emplace_back(StripDecoder{.content = content,
                                    .start = d.at("start").get<std::size_t>(),
                                    .stop = d.at("stop").get<std::size_t>()});
  } else if (type == "Metaspace") {
    steps.emplace_back(
        MetaspaceDecoder{.replacement = load_replacement(d, what, field),
                         .drop_first_token_replacements =
                             load_prepend_scheme(d, what, field) != PrependScheme::kNever});
  } else {
    unsupported(what, field + ".type", shown(d["type"]),
                "decoders: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence");
  }
}

void load_model(const json& m, const std::string& what, Tokenizer::Impl& impl) {
  const std::string type = m.contains("type") ? m["type"].get<std::string>() : "BPE";
  if (type != "BPE") unsupported(what, "model.type", shown(m["type"]), "models: BPE");
  if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0.0)
    unsupported(what, "model.dropout", shown(m["dropout"]), "dropout: null");
  for (const char* name : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(name) && !m[name].is_null() && !m[name].get<std::string>().empty())
      unsupported(what, trainyard::detail::concat("model.", name), shown(m[name]), "null");
  impl.byte_fallback = flag(m, "byte_fallback", false);
  impl.fuse_unk = flag(m, "fuse_unk", false);
  impl.ignore_merges = flag(m, "ignore_merges", false);

  TY_CHECK_T(CorruptDataError, m.contains("vocab") && m["vocab"].is_object(), what,
             m.contains("vocab") ? ": field \"model.vocab\" should map tokens to ids."
                                 : ": field \"model.vocab\" is missing; a BPE model maps its "
                                   "tokens to ids there.");
  const json& vocab = m["vocab"];
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
  TY_CHECK_T(CorruptDataError, m.contains("merges") && m["merges"].is_array(), what,
             m.contains("merges") ? ": field \"model.merges\" should be a list of merges."
                                  : ": field \"model.merges\" is missing; a BPE model lists its "
                                    "merges there (an empty list when it has none).");
  const json& merges = m["merges"];
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
      TY_CHECK_T(CorruptDataError,
                 merges[rank].is_array() && merges[rank].size() == 2 &&
                     merges[rank][0].is_string() && merges[rank][1].is_string(),
                 what, ": field \"model.merges[", rank, "]\" is ", shown(merges[rank]),
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
    const auto fallback = impl.vocab.find(byte_fallback_token(static_cast<unsigned char>(b)));
    impl.fallback_ids[b] = fallback == impl.vocab.end() ? -1 : fallback->second;
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

Tokenizer Tokenizer::from_json(std::string_view json_text, const std::string& what) {
  auto impl = std::make_unique<Impl>();
  impl->source = what;
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    throw CorruptDataError(trainyard::detail::concat(what, " is not valid JSON: ", e.what()));
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
      load_normalizer(root["normalizer"], what, "normalizer", impl->normalizers);
    load_pre_tokenizer(root.value("pre_tokenizer", json()), what, "pre_tokenizer",
                       impl->pre_tokenizers);
    for (std::size_t i = 0; i + 1 < impl->pre_tokenizers.size(); ++i)
      if (std::holds_alternative<ByteLevelPreTokenizer>(impl->pre_tokenizers[i]))
        unsupported(what, "pre_tokenizer", "a Sequence with ByteLevel before its last step",
                    "ByteLevel as the last pre-tokenizer, as GPT-2 and Llama 3 place it");
    impl->byte_level_words =
        !impl->pre_tokenizers.empty() &&
        std::holds_alternative<ByteLevelPreTokenizer>(impl->pre_tokenizers.back());
    if (root.contains("post_processor"))
      load_post_processor(root["post_processor"], what, "post_processor", *impl);
    const json decoder = root.value("decoder", json());
    load_decoder(decoder, what, "decoder", impl->decoders);
    impl->has_decoder = !decoder.is_null();
    impl->byte_level_decoder =
        impl->decoders.size() == 1 && std::holds_alternative<ByteLevelDecoder>(impl->decoders[0]);
    if (root.contains("added_tokens") && !root["added_tokens"].is_null())
      load_added_tokens(root["added_tokens"], what, *impl);
  } catch (const json::exception& e) {  // a field of the wrong type or missing
    throw CorruptDataError(
        trainyard::detail::concat(what, " is not a tokenizer.json trainyard can read: ", e.what()));
  }
  // BPE over an empty vocabulary encodes every text (but added tokens) to nothing.
  TY_CHECK_T(CorruptDataError, !impl->vocab.empty(), what,
             " has an empty vocabulary (\"model.vocab\" holds no token): every text would "
             "encode to no token. HINT: use the tokenizer.json saved with the model (Hugging "
             "Face's tokenizer.save() writes its vocabulary there).");
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

}  // namespace trainyard::hf
