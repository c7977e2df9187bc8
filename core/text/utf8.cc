#include "core/text/utf8.h"

#include <cstdint>

namespace kvrt::text {

size_t utf8_sequence(std::string_view s, size_t i, size_t* subpart) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t lead = byte(i);
  *subpart = 1;
  if (lead < 0x80) return 1;
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // the second byte's range; later bytes are 80..BF
  if (lead >= 0xC2 && lead <= 0xDF) {
    need = 1;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    need = 2;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    need = 3;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return 0;
    const uint8_t b = byte(i + k);
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
    *subpart = k + 1;
  }
  return need + 1;
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t subpart;
    const size_t n = utf8_sequence(s, i, &subpart);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

void append_utf8_lossy(std::string_view bytes, std::string* out) {
  for (size_t i = 0; i < bytes.size();) {
    size_t subpart;
    const size_t n = utf8_sequence(bytes, i, &subpart);
    if (n == 0) {
      out->append(kReplacementChar);
      i += subpart;
    } else {
      out->append(bytes.substr(i, n));
      i += n;
    }
  }
}

std::string_view valid_utf8_or_repaired(std::string_view text, std::string* storage) {
  if (valid_utf8(text)) return text;
  storage->clear();
  append_utf8_lossy(text, storage);
  return *storage;
}

char32_t decode_utf8(std::string_view s, size_t i, size_t* len) {
  const auto b = static_cast<unsigned char>(s[i]);
  int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + n > s.size()) {
    *len = 1;
    return b < 0x80 ? b : 0xFFFD;
  }
  uint32_t cp = n == 1 ? b : b & (0x7F >> n);
  for (int k = 1; k < n; ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    if ((c >> 6) != 2) {
      *len = 1;
      return 0xFFFD;
    }
    cp = (cp << 6) | (c & 0x3F);
  }
  *len = static_cast<size_t>(n);
  return cp;
}

void append_utf8(std::string* out, char32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::vector<std::string_view> code_points(std::string_view s) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < s.size();) {
    size_t len = 0;
    decode_utf8(s, i, &len);
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

size_t count_code_points(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) {
    size_t len = 0;
    decode_utf8(s, i, &len);
    i += len;
  }
  return n;
}

size_t utf8_characters(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

}  // namespace kvrt::text
