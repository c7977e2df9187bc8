// UTF-8, the one place kvrt reads and writes it: validation (RFC 3629), lossy repair as the
// reference decoders do it, code points one at a time, and counting characters.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace kvrt::text {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// RFC 3629 UTF-8: no overlong forms, no surrogates, nothing past U+10FFFF.
bool valid_utf8(std::string_view s);

// Length of the valid UTF-8 sequence at s[i], or 0 when it is not one; *subpart is then the
// length of its maximal subpart (Unicode's "substitution of maximal subparts", which Rust's
// from_utf8_lossy and the WHATWG TextDecoder both follow: one U+FFFD for each).
size_t utf8_sequence(std::string_view s, size_t i, size_t* subpart);

// bytes with every invalid sequence replaced by U+FFFD, as the reference decoders do.
void append_utf8_lossy(std::string_view bytes, std::string* out);
// text when it is valid UTF-8, else its lossy repair, written to *storage (which then backs the
// view): input as a reference that takes Unicode strings reads it.
std::string_view valid_utf8_or_repaired(std::string_view text, std::string* storage);

// The code point at s[i] and its length; a byte that starts no well-formed sequence reads as
// U+FFFD of length 1. On valid UTF-8 it is the character there.
char32_t decode_utf8(std::string_view s, size_t i, size_t* len);

// cp's UTF-8 bytes appended to out.
void append_utf8(std::string* out, char32_t cp);

// The code points of s as decode_utf8 reads them, each as its bytes.
std::vector<std::string_view> code_points(std::string_view s);
// How many code points decode_utf8 reads in s (a byte of a malformed sequence counts one).
size_t count_code_points(std::string_view s);

// The characters (code points) of UTF-8 text, as Python's len() counts them: the bytes that do
// not continue a character.
size_t utf8_characters(std::string_view s);

}  // namespace kvrt::text
