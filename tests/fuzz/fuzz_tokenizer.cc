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
#include "tests/fuzz/tokenizer_checks.h"

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Tokenizer* const tokenizers[] = {byte_level().release(),
                                                sentencepiece_like().release()};
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (const Tokenizer* t : tokenizers) {
    // The byte-level tokenizer loses nothing.
    kvrt::fuzz::check_encode_decode(*t, text, /*lossless=*/t == tokenizers[0]);
    kvrt::fuzz::check_decodes_bytes_as_ids(*t, text);
  }
  return 0;
}
