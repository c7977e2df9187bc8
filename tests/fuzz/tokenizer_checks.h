// What the tokenizer fuzzers check of any tokenizer on any input: every id in range, every decode
// valid UTF-8 (by a validator of the fuzzers' own, not the one under test) and, for a lossless
// tokenizer, valid text back unchanged (special-token strings in it included, when they are
// kept); and the input's bytes read as little-endian int32 ids decode to valid UTF-8.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "core/text/tokenizer.h"

namespace kvrt::fuzz {

inline bool valid_utf8(std::string_view s) {
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

inline void check(bool ok) {
  if (!ok) __builtin_trap();
}

// `text` encoded with and without the tokenizer's added tokens (BOS), decoded with and without
// skipping special tokens.
inline void check_encode_decode(const text::Tokenizer& t, std::string_view text, bool lossless) {
  for (bool special : {false, true}) {
    const std::vector<int32_t> ids = t.encode(text, special);
    for (int32_t id : ids) check(id >= 0 && id < t.vocab_size());
    for (bool skip : {false, true}) {
      const std::string decoded = t.decode(ids, text::DecodeOptions{skip});
      check(valid_utf8(decoded));
      if (lossless && valid_utf8(text) && !special && !skip) check(decoded == text);
    }
  }
}

inline void check_decodes_bytes_as_ids(const text::Tokenizer& t, std::string_view bytes) {
  std::vector<int32_t> ids(bytes.size() / 4);
  if (!ids.empty()) std::memcpy(ids.data(), bytes.data(), ids.size() * 4);
  check(valid_utf8(t.decode(ids)));
  check(valid_utf8(t.decode(ids, text::DecodeOptions{false})));
}

}  // namespace kvrt::fuzz
