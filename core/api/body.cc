#include "core/api/body.h"

#include <algorithm>

#include "core/text/utf8.h"
#include "core/util/text.h"

namespace kvrt::api {

using nlohmann::json;

ApiError bad(const std::string& param, const std::string& message) {
  return ApiError{400, param.empty() ? message : param + ": " + message, param};
}

std::string type_name(const json& v) {
  return v.is_null() ? "null" : v.is_boolean() ? "a boolean" : v.is_number() ? "a number"
       : v.is_string() ? "a string" : v.is_array() ? "a list" : "an object";
}

std::variant<std::vector<int32_t>, ApiError> read_ids(const json& v, const std::string& param,
                                                      int32_t vocab) {
  if (!v.is_array()) return bad(param, "expected a list of token ids, found " + type_name(v));
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const json& x = v[i];
    const std::string at = param + "[" + std::to_string(i) + "]";
    if (!x.is_number_integer()) return bad(at, "expected a token id, found " + type_name(x));
    if (x.is_number_unsigned() ? x.get<uint64_t>() > uint64_t{INT32_MAX}
                               : (x.get<int64_t>() < INT32_MIN || x.get<int64_t>() > INT32_MAX)) {
      return bad(at, x.dump() + " is not a token id (outside 32 bits)");
    }
    if (vocab > 0 && (x.get<int64_t>() < 0 || x.get<int64_t>() >= vocab)) {
      return bad(at, x.dump() + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
    ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
  }
  return ids;
}

std::variant<std::string, ApiError> text_content(const json& c, const std::string& at,
                                                 std::initializer_list<std::string_view> types,
                                                 const char* only, bool strict) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) {
    return bad(at, "expected a string or a list of text parts, found " + type_name(c));
  }
  std::string content;
  for (size_t k = 0; k < c.size(); ++k) {
    const json& part = c[k];
    const std::string pat = at + "[" + std::to_string(k) + "]";
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      return bad(pat + ".type", "expected a content part {\"type\": \"" +
                                    std::string(*types.begin()) + "\", \"text\"}");
    }
    const std::string type = part["type"].get<std::string>();
    if (std::find(types.begin(), types.end(), type) == types.end()) {
      return bad(pat + ".type", "'" + type + "' parts are not supported" + only);
    }
    if (!part.contains("text") || !part["text"].is_string()) {
      return bad(pat + ".text", "expected a string");
    }
    for (auto it = part.begin(); strict && it != part.end(); ++it) {
      if (it.key() != "type" && it.key() != "text") {
        return bad(pat + "." + it.key(), "unknown field");
      }
    }
    if (k > 0) content += "\n";
    content += part["text"].get<std::string>();
  }
  return content;
}

namespace {

// Where a body's JSON stops parsing: the path of the value being read ("sampling_params.top_p",
// "messages[1].content") and why, so that a number nlohmann cannot hold (1e309: beyond a
// double) is refused by its field's name rather than as text that is not JSON.
class ParseErrorPath : public nlohmann::json_sax<json> {
 public:
  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override {
    frames_.push_back({false, 0, ""});
    return true;
  }
  bool key(string_t& k) override {
    frames_.back().key = k;
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override {
    frames_.push_back({true, 0, ""});
    return true;
  }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t position, const std::string& token,
                   const nlohmann::detail::exception& e) override {
    overflow_ = e.id == 406;  // out_of_range.406: "number overflow"
    position_ = position;
    token_ = token;
    return false;
  }

  bool overflow() const { return overflow_; }
  size_t position() const { return position_; }
  const std::string& token() const { return token_; }
  std::string path() const {
    std::string p;
    for (const Frame& f : frames_) {
      if (f.array) {
        p += "[" + std::to_string(f.index) + "]";
      } else {
        p += (p.empty() ? "" : ".") + f.key;
      }
    }
    return p;
  }

 private:
  struct Frame {
    bool array;
    size_t index;     // an array's: the values read so far
    std::string key;  // an object's: the key being read
  };
  bool value() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
    return true;
  }
  bool close() {
    frames_.pop_back();
    return value();
  }
  std::vector<Frame> frames_;
  bool overflow_ = false;
  size_t position_ = 0;
  std::string token_;
};

}  // namespace

std::variant<json, ApiError> read_object(std::string_view body) {
  if (!text::valid_utf8(body)) return bad("", "the request body is not valid UTF-8");
  // nlohmann's lexer takes a NUL byte for the end of its input, so "{}\0anything" would read
  // as {}; JSON has no place for a raw NUL (inside a string it must be escaped).
  if (const size_t nul = body.find('\0'); nul != std::string_view::npos) {
    return bad("",
               "the request body is not valid JSON: a NUL byte at offset " + std::to_string(nul));
  }
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    ParseErrorPath where;
    json::sax_parse(body, &where, nlohmann::detail::input_format_t::json, /*strict=*/true,
                    /*ignore_comments=*/false);
    if (where.overflow() && !where.path().empty()) {
      return bad(where.path(), where.token() + " is out of range (beyond a double's)");
    }
    return bad("", "the request body is not valid JSON (at byte " +
                       std::to_string(where.position()) + ")");
  }
  if (!j.is_object()) return bad("", "expected a JSON object, found " + type_name(j));
  return j;
}

std::optional<ApiError> unknown_field(const json& j, std::initializer_list<const char*> known) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (std::find_if(known.begin(), known.end(), [&key](const char* k) { return key == k; }) ==
        known.end()) {
      return bad(key, "unknown field");
    }
  }
  return std::nullopt;
}

std::optional<ApiError> refused_field(const json& j, std::span<const FieldRule> rules) {
  for (const FieldRule& r : rules) {
    if (j.contains(r.key) && !j[r.key].is_null() && !r.accepts(j[r.key])) {
      return bad(r.key, r.why);
    }
  }
  return std::nullopt;
}

bool never(const json&) { return false; }

std::optional<ApiError> no_op(const json& j) {
  static const FieldRule kNoOps[] = {
      {"lora_path", never, "LoRA adapters are not supported"},
      {"image_data", never, "images are not supported: this server serves text models"},
      {"modalities", [](const json& v) { return v.is_array() && v.empty(); },
       "only text is supported"},
      {"return_hidden_states", [](const json& v) { return v == false; },
       "hidden states are not returned"},
      {"custom_logit_processor", never, "custom logit processors are not supported"},
      {"bootstrap_host", never, "prefill/decode disaggregation is not supported"},
      {"bootstrap_port", never, "prefill/decode disaggregation is not supported"},
      {"bootstrap_room", never, "prefill/decode disaggregation is not supported"},
      {"user", [](const json& v) { return v.is_string(); }, "expected a string"},
      // Requests are served first come, first served; a priority is accepted and not used.
      {"priority", [](const json& v) { return v.is_number_integer(); }, "expected an integer"},
  };
  if (auto e = refused_field(j, kNoOps)) return e;
  if (j.contains("response_format") && !j["response_format"].is_null()) {
    const json& f = j["response_format"];
    if (!f.is_object() || !f.contains("type") || !f["type"].is_string()) {
      return bad("response_format", "expected {\"type\": \"text\"}");
    }
    if (f["type"] != "text") {
      return bad("response_format", "'" + f["type"].get<std::string>() +
                                        "' needs constrained decoding, which kvrt does not have "
                                        "yet (only {\"type\": \"text\"})");
    }
  }
  return std::nullopt;
}

ApiError renamed(ApiError error,
                 std::initializer_list<std::pair<const char*, const char*>> names) {
  for (auto [from, to] : names) {
    const std::string f = from;
    if (error.param.rfind(f, 0) == 0) {
      error.param = to + error.param.substr(f.size());
      if (error.message.rfind(f, 0) == 0) error.message = to + error.message.substr(f.size());
      break;
    }
  }
  return error;
}

std::optional<ApiError> read_bool(const json& j, const char* key, bool* out) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_boolean()) return bad(key, "expected a boolean, found " + type_name(j[key]));
  *out = j[key].get<bool>();
  return std::nullopt;
}

}  // namespace kvrt::api
