// Decoders: ByteLevel, ByteFallback, Metaspace, Fuse, Strip and Replace, in sequence.
#include "core/text/tokenizer_json/tokenizer_json.h"

namespace kvrt::text::tokenizer_json {

namespace {

// The inverse of byte_chars(): code point -> byte, -1 for a code point that stands for no byte.
int char_byte(char32_t cp) {
  static const std::unordered_map<char32_t, int> table = [] {
    std::unordered_map<char32_t, int> t;
    for (int b = 0; b < 256; ++b) {
      size_t len;
      t[decode_utf8(byte_chars()[b], 0, &len)] = b;
    }
    return t;
  }();
  const auto it = table.find(cp);
  return it == table.end() ? -1 : it->second;
}

// "<0x0A>" -> 0x0A; -1 for any other token.
int byte_token(std::string_view token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  int value = 0;
  for (char c : token.substr(3, 2)) {
    value <<= 4;
    if (c >= '0' && c <= '9') {
      value |= c - '0';
    } else if (c >= 'A' && c <= 'F') {
      value |= c - 'A' + 10;
    } else {
      return -1;
    }
  }
  return value;
}

}  // namespace

void decode_chain(const std::vector<DecoderStep>& steps, std::vector<std::string>* tokens) {
  for (const DecoderStep& step : steps) {
    switch (step.kind) {
      case DecoderStep::Kind::kByteLevel: {
        std::string bytes;
        for (const std::string& token : *tokens) {
          const size_t mark = bytes.size();
          bool all = true;
          for (size_t i = 0; i < token.size();) {
            size_t len;
            const int b = char_byte(decode_utf8(token, i, &len));
            if (b < 0) {
              all = false;
              break;
            }
            bytes += static_cast<char>(b);
            i += len;
          }
          // A token with a character that stands for no byte passes as its own text.
          if (!all) bytes.replace(mark, std::string::npos, token);
        }
        std::string text;
        append_utf8_lossy(bytes, &text);
        tokens->assign(1, std::move(text));
        break;
      }
      case DecoderStep::Kind::kByteFallback: {
        std::vector<std::string> out;
        std::string pending;  // consecutive byte tokens
        auto flush = [&] {
          if (pending.empty()) return;
          if (valid_utf8(pending)) {
            out.push_back(pending);
          } else {
            // One U+FFFD per byte, as the reference does here.
            for (size_t i = 0; i < pending.size(); ++i) out.emplace_back(kReplacementChar);
          }
          pending.clear();
        };
        for (std::string& token : *tokens) {
          const int b = byte_token(token);
          if (b >= 0) {
            pending += static_cast<char>(b);
            continue;
          }
          flush();
          out.push_back(std::move(token));
        }
        flush();
        *tokens = std::move(out);
        break;
      }
      case DecoderStep::Kind::kMetaspace:
        for (size_t i = 0; i < tokens->size(); ++i) {
          const bool drop = i == 0 && step.prepend != PrependScheme::kNever;
          (*tokens)[i] =
              Pattern{step.replacement, nullptr}.replace_all((*tokens)[i], drop ? "" : " ");
        }
        break;
      case DecoderStep::Kind::kFuse: {
        std::string all;
        for (const std::string& token : *tokens) all += token;
        tokens->assign(1, std::move(all));
        break;
      }
      case DecoderStep::Kind::kStrip:
        for (std::string& token : *tokens) {
          const std::string_view c = step.content;
          size_t begin = 0, end = token.size();
          for (size_t k = 0; k < step.start && token.compare(begin, c.size(), c) == 0; ++k) {
            begin += c.size();
          }
          for (size_t k = 0; k < step.stop && end >= begin + c.size() &&
                             token.compare(end - c.size(), c.size(), c) == 0;
               ++k) {
            end -= c.size();
          }
          token = token.substr(begin, end - begin);
        }
        break;
      case DecoderStep::Kind::kReplace:
        for (std::string& token : *tokens) token = step.pattern.replace_all(token, step.content);
        break;
    }
  }
}

namespace {

Status read_decoder_one(const Reader& r, const json& j, const std::string& key,
                        const std::string& type, std::vector<DecoderStep>* out) {
  DecoderStep step;
  if (type == "ByteLevel") {
    step.kind = DecoderStep::Kind::kByteLevel;
  } else if (type == "ByteFallback") {
    step.kind = DecoderStep::Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = DecoderStep::Kind::kFuse;
  } else if (type == "Metaspace") {
    step.kind = DecoderStep::Kind::kMetaspace;
    if (Status s = r.get_char(j, "replacement", key, &step.replacement); !s.ok()) return s;
    if (Status s = read_prepend_scheme(r, j, key, &step.prepend); !s.ok()) return s;
  } else if (type == "Strip") {
    step.kind = DecoderStep::Kind::kStrip;
    if (Status s = r.get_char(j, "content", key, &step.content); !s.ok()) return s;
    for (auto [field, value] : {std::pair("start", &step.start), std::pair("stop", &step.stop)}) {
      const auto it = j.find(field);
      if (it == j.end() || !it->is_number_unsigned()) {
        return r.invalid(key + "." + field, "is not a non-negative integer");
      }
      *value = it->get<size_t>();
    }
  } else if (type == "Replace") {
    step.kind = DecoderStep::Kind::kReplace;
    if (Status s = r.get_pattern(j, key, &step.pattern); !s.ok()) return s;
    if (Status s = r.get_string(j, "content", key, &step.content); !s.ok()) return s;
  } else {
    return r.unsupported(key + ".type", "\"" + type + "\"");
  }
  out->push_back(std::move(step));
  return Status::Ok();
}

}  // namespace

Status read_decoder(const Reader& r, const json& j, const std::string& key,
                    std::vector<DecoderStep>* out) {
  return r.read_flattened(j, key, "decoders",
                          [&](const json& part, const std::string& at, const std::string& type) {
                            return read_decoder_one(r, part, at, type, out);
                          });
}

}  // namespace kvrt::text::tokenizer_json
