// tiktoken tokenizers (Kimi's tiktoken.model format) on arbitrary bytes, two ways. Input whose
// first byte is even is read as a tiktoken.model file (with and without a tokenizer_config.json
// naming specials): it must load or fail with a message, never crash; when it loads, a fixed
// text must encode to ids in range and decode to valid UTF-8. Otherwise the rest is text for a
// small byte-level tiktoken model built here (the 256 bytes, some merges, Kimi's split pattern
// and specials): encoded with and without BOS, every id in range, decoding valid UTF-8 and, for
// valid UTF-8 text, the text itself; and read as little-endian int32 ids to decode.
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "core/text/tiktoken.h"
#include "core/text/tokenizer_config.h"
#include "tests/fuzz/tokenizer_checks.h"

namespace {

using kvrt::text::Tokenizer;

std::string base64(std::string_view bytes) {
  static const char* const kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t v = static_cast<uint8_t>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= static_cast<uint8_t>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) v |= static_cast<uint8_t>(bytes[i + 2]);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[v & 63] : '=';
  }
  return out;
}

// Ranks 0..255 the single bytes, then merged tokens of English, code and CJK bytes.
std::string small_model() {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
  for (const char* t : {"th", "the", " the", "in", "ing", " a", "an", "and", " and", "12", "123",
                        "  ", "\r\n", "\xE4\xBD", "\xE4\xBD\xA0", "\xE5\xA5\xBD"}) {
    tokens.emplace_back(t);
  }
  std::string model;
  for (size_t i = 0; i < tokens.size(); ++i)
    model += base64(tokens[i]) + " " + std::to_string(i) + "\n";
  return model;
}

kvrt::text::TokenizerConfig specials(int64_t first) {
  kvrt::text::TokenizerConfig c;
  c.added_tokens_decoder = {{first, "[BOS]"},
                            {first + 1, "[EOS]"},
                            {first + 2, "<|im_end|>"},
                            {first + 3, "<|im_user|>"}};
  c.bos_token = "[BOS]";
  c.eos_token = "[EOS]";
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    for (bool with_config : {false, true}) {
      auto t = kvrt::text::parse_tiktoken(rest,
                                          with_config ? specials(3) : kvrt::text::TokenizerConfig{},
                                          "tiktoken.model", "tokenizer_config.json");
      if (t.ok()) {
        kvrt::fuzz::check_encode_decode(**t, "Hello, world! 你好 12345 [BOS]\r\n  x",
                                        /*lossless=*/false);
      }
    }
    return 0;
  }
  static const Tokenizer* const small = [] {
    auto t = kvrt::text::parse_tiktoken(small_model(), specials(272), "small", "small config");
    kvrt::fuzz::check(t.ok());
    return t->release();
  }();
  kvrt::fuzz::check_encode_decode(*small, rest, /*lossless=*/true);
  kvrt::fuzz::check_decodes_bytes_as_ids(*small, rest);
  return 0;
}
