// Normalizers: Unicode forms (utf8proc), Lowercase, Replace and Prepend, in sequence.
#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>

#include "core/text/tokenizer_json/tokenizer_json.h"

namespace kvrt::text::tokenizer_json {

namespace {

Status read_normalizer_one(const Reader& r, const json& j, const std::string& key,
                           const std::string& type, std::vector<NormalizerStep>* out) {
  NormalizerStep step;
  if (type == "NFC" || type == "NFKC" || type == "NFD" || type == "NFKD") {
    step.kind = NormalizerStep::Kind::kUnicode;
    const bool compat = type == "NFKC" || type == "NFKD";
    const bool compose = type == "NFC" || type == "NFKC";
    step.utf8proc_options = UTF8PROC_STABLE | (compose ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE) |
                            (compat ? UTF8PROC_COMPAT : 0);
  } else if (type == "Lowercase") {
    step.kind = NormalizerStep::Kind::kLowercase;
  } else if (type == "Replace") {
    step.kind = NormalizerStep::Kind::kReplace;
    if (Status s = r.get_pattern(j, key, &step.pattern); !s.ok()) return s;
    if (Status s = r.get_string(j, "content", key, &step.content); !s.ok()) return s;
  } else if (type == "Prepend") {
    step.kind = NormalizerStep::Kind::kPrepend;
    if (Status s = r.get_string(j, "prepend", key, &step.content); !s.ok()) return s;
  } else {
    return r.unsupported(key + ".type", "\"" + type + "\"");
  }
  out->push_back(std::move(step));
  return Status::Ok();
}

}  // namespace

void normalize(const std::vector<NormalizerStep>& steps, std::string* text) {
  for (const NormalizerStep& step : steps) {
    switch (step.kind) {
      case NormalizerStep::Kind::kUnicode: {
        // ASCII is already in every normalization form.
        if (std::all_of(text->begin(), text->end(),
                        [](char c) { return static_cast<uint8_t>(c) < 0x80; })) {
          break;
        }
        utf8proc_uint8_t* out = nullptr;
        const utf8proc_ssize_t n =
            utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text->data()),
                         static_cast<utf8proc_ssize_t>(text->size()), &out,
                         static_cast<utf8proc_option_t>(step.utf8proc_options));
        // utf8proc fails only on invalid UTF-8 (encode repairs it first) or out of memory.
        if (n >= 0) text->assign(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
        std::free(out);
        break;
      }
      case NormalizerStep::Kind::kLowercase: {
        std::string out;
        out.reserve(text->size());
        for (size_t i = 0; i < text->size();) {
          size_t len;
          const char32_t cp = decode_utf8(*text, i, &len);
          append_utf8(&out,
                      static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
          i += len;
        }
        *text = std::move(out);
        break;
      }
      case NormalizerStep::Kind::kReplace:
        *text = step.pattern.replace_all(*text, step.content);
        break;
      case NormalizerStep::Kind::kPrepend:
        if (!text->empty()) text->insert(0, step.content);
        break;
    }
  }
}

Status read_normalizer(const Reader& r, const json& j, const std::string& key,
                       std::vector<NormalizerStep>* out) {
  return r.read_flattened(j, key, "normalizers",
                          [&](const json& part, const std::string& at, const std::string& type) {
                            return read_normalizer_one(r, part, at, type, out);
                          });
}

}  // namespace kvrt::text::tokenizer_json
