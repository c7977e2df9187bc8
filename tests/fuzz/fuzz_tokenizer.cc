// tokenizer.json's encode and decode on arbitrary bytes, with two small tokenizers built here:
// a byte-level one (GPT-2 split regex, merges, added tokens, a TemplateProcessing) and a
// SentencePiece-derived one (NFKC and Replace normalizers, Metaspace, byte_fallback, lstrip /
// rstrip / single_word added tokens, the ByteFallback/Fuse/Strip decoder chain). The input is
// encoded as text and also read as little-endian int32 ids to decode. Checks: every decode is
// valid UTF-8, and the byte-level tokenizer gives valid UTF-8 text back unchanged.
#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/text/tokenizer_json.h"

namespace {

using json = nlohmann::json;
using kvrt::text::Tokenizer;

// GPT-2's byte-to-character table, the byte-level vocabulary's first 256 entries.
std::vector<std::string> byte_chars() {
  std::vector<std::string> out;
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    const int cp = printable ? b : 256 + n++;
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    out.push_back(s);
  }
  return out;
}

json base_model(bool byte_fallback) {
  json vocab = json::object();
  auto add = [&](const std::string& t) {
    if (!vocab.contains(t)) vocab[t] = static_cast<int>(vocab.size());
  };
  for (const std::string& c : byte_chars()) add(c);
  add("\xE2\x96\x81");  // ▁
  add("<unk>");
  for (int b = 0; b < 256 && byte_fallback; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    add(name);
  }
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"\xC4\xA0", "t"},    {"h", "e"}, {"\xC4\xA0t", "he"},   {"i", "n"},
      {"in", "g"},          {"e", "r"}, {"\xC4\xA0", "a"},     {"a", "n"},
      {"an", "d"},          {"1", "2"}, {"\xE2\x96\x81", "t"}, {"\xE2\x96\x81t", "he"},
      {"\xE2\x96\x81", "a"}};
  json list = json::array();
  for (const auto& [a, b] : merges) {
    add(a + b);
    list.push_back(json::array({a, b}));
  }
  return {{"type", "BPE"},        {"vocab", vocab},
          {"merges", list},       {"byte_fallback", byte_fallback},
          {"unk_token", "<unk>"}, {"fuse_unk", true}};
}

json added_token(int id, const std::string& content, bool lstrip, bool rstrip, bool single_word,
                 bool normalized) {
  return {{"id", id},         {"content", content},         {"lstrip", lstrip},
          {"rstrip", rstrip}, {"single_word", single_word}, {"normalized", normalized},
          {"special", true}};
}

std::unique_ptr<Tokenizer> byte_level() {
  json model = base_model(false);
  const int size = static_cast<int>(model["vocab"].size());
  json j = {
      {"model", model},
      {"added_tokens", json::array({added_token(size, "<|s|>", false, false, false, false),
                                    added_token(size + 1, "<|e|>", false, false, false, false)})},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         json::array({{{"SpecialToken", {{"id", "<|s|>"}}}}, {{"Sequence", {{"id", "A"}}}}})},
        {"special_tokens", {{"<|s|>", {{"id", "<|s|>"}, {"ids", {size}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}}}};
  return kvrt::text::parse_hf_tokenizer(j.dump(), {}, "byte-level").value();
}

std::unique_ptr<Tokenizer> sentencepiece_like() {
  json model = base_model(true);
  const int size = static_cast<int>(model["vocab"].size());
  const std::string space = "\xE2\x96\x81";
  json j = {
      {"model", model},
      {"added_tokens", json::array({added_token(size, "<mask>", true, true, false, false),
                                    added_token(size + 1, "word", false, false, true, true),
                                    added_token(size + 2, "</s>", false, true, false, false)})},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         json::array(
             {{{"type", "NFKC"}},
              {{"type", "Replace"}, {"pattern", {{"Regex", "\\s{3,}"}}}, {"content", " "}}})}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", json::array({{{"type", "Digits"}, {"individual_digits", true}},
                                       {{"type", "Split"},
                                        {"pattern", {{"Regex", "(?i:the)|\\p{P}"}}},
                                        {"behavior", "MergedWithNext"},
                                        {"invert", false}},
                                       {{"type", "Metaspace"},
                                        {"replacement", space},
                                        {"prepend_scheme", "first"},
                                        {"split", true}}})}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         json::array({{{"type", "Replace"}, {"pattern", {{"String", space}}}, {"content", " "}},
                      {{"type", "ByteFallback"}},
                      {{"type", "Fuse"}},
                      {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}}};
  return kvrt::text::parse_hf_tokenizer(j.dump(), {}, "sentencepiece-like").value();
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<uint8_t>(s[i]);
    size_t n = c < 0x80                 ? 1
               : c >= 0xC2 && c <= 0xDF ? 2
               : c >= 0xE0 && c <= 0xEF ? 3
               : c >= 0xF0 && c <= 0xF4 ? 4
                                        : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<uint8_t>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    const uint8_t second = static_cast<uint8_t>(s[i + 1 < s.size() ? i + 1 : i]);
    if ((c == 0xE0 && second < 0xA0) || (c == 0xED && second > 0x9F) ||
        (c == 0xF0 && second < 0x90) || (c == 0xF4 && second > 0x8F)) {
      return false;
    }
    i += n;
  }
  return true;
}

void check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Tokenizer* const tokenizers[] = {byte_level().release(),
                                                sentencepiece_like().release()};
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<int32_t> as_ids(size / 4);
  if (!as_ids.empty()) std::memcpy(as_ids.data(), data, as_ids.size() * 4);
  for (const Tokenizer* t : tokenizers) {
    for (bool special : {false, true}) {
      const std::vector<int32_t> ids = t->encode(text, special);
      for (int32_t id : ids) check(id >= 0 && id < t->vocab_size());
      for (bool skip : {false, true}) {
        const std::string decoded = t->decode(ids, kvrt::text::DecodeOptions{skip});
        check(valid_utf8(decoded));
        // The byte-level tokenizer loses nothing: valid text comes back as it was (special-token
        // strings in it included, when they are kept).
        if (t == tokenizers[0] && valid_utf8(text) && !special && !skip) check(decoded == text);
      }
    }
    check(valid_utf8(t->decode(as_ids)));
    check(valid_utf8(t->decode(as_ids, kvrt::text::DecodeOptions{false})));
  }
  return 0;
}
