#include "core/server/api.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <string_view>
#include <utility>

#include "core/text/utf8.h"

namespace kvrt::server {

using nlohmann::json;

namespace {

ApiError bad(const std::string& param, const std::string& message) {
  return ApiError{400, param.empty() ? message : param + ": " + message, param};
}

std::string type_name(const json& v) {
  return v.is_null() ? "null" : v.is_boolean() ? "a boolean" : v.is_number() ? "a number"
       : v.is_string() ? "a string" : v.is_array() ? "a list" : "an object";
}

// A list of token ids, each inside the vocabulary when `vocab` > 0 (a generation's ids are the
// serving core's to check).
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

}  // namespace

namespace {

// A message's content: a string, or a list of text parts (whose type is one of `types`) joined
// with newlines, as vLLM renders them for a text-only template. `at` names the content in
// errors, `only` ends the refusal of another part type; `strict`: a part's other fields are
// refused.
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

}  // namespace

std::variant<std::vector<text::ChatMessage>, ApiError> read_chat_messages(const json& j) {
  if (!j.contains("messages") || !j["messages"].is_array() || j["messages"].empty()) {
    return bad("messages", "expected a non-empty list of {role, content}");
  }
  std::vector<text::ChatMessage> messages;
  for (size_t i = 0; i < j["messages"].size(); ++i) {
    const json& m = j["messages"][i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return bad(at + ".role", "expected a string (system, developer, user, assistant or tool)");
    }
    // OpenAI's roles; developer is its newer name for system, which the templates know. Any
    // other is refused (as OpenAI and SGLang do) rather than rendered as nothing.
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      return bad(at + ".role", "'" + m["role"].get<std::string>() +
                                   "' is not a role: expected system, developer, user, "
                                   "assistant or tool");
    }
    if (!m.contains("content")) return bad(at + ".content", "missing");
    auto content = text_content(m["content"], at + ".content", {"text"},
                                ": this server serves text models (only \"text\" parts)",
                                /*strict=*/true);
    if (auto* e = std::get_if<ApiError>(&content)) return *e;
    for (auto it = m.begin(); it != m.end(); ++it) {
      // "name" is OpenAI's speaker label; templates that do not use it ignore it, as in HF.
      if (it.key() != "role" && it.key() != "content" && it.key() != "name") {
        return bad(at + "." + it.key(), it.key() == "tool_calls" || it.key() == "tool_call_id"
                                            ? "tools are not supported"
                                            : "unknown field");
      }
    }
    messages.push_back({std::move(role), std::get<std::string>(std::move(content))});
  }
  return messages;
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

// A JSON object body, valid UTF-8, or the error.
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

// The fields of `j` outside `known`, refused by name.
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

// The prompt ids of j["messages"] through the served chat template (kvrt's default when the
// server has none), as /v1/chat/completions and /tokenize both read them.
std::variant<std::vector<int32_t>, ApiError> chat_ids(const json& j, const ModelLimits& limits,
                                                      bool add_generation_prompt) {
  auto messages = read_chat_messages(j);
  if (auto* e = std::get_if<ApiError>(&messages)) return *e;
  if (limits.tokenizer == nullptr) return bad("messages", "the model has no tokenizer");
  // Refused by its size before it is rendered and tokenized, as a text prompt is.
  uint64_t bytes = 0;
  for (const text::ChatMessage& m : std::get<std::vector<text::ChatMessage>>(messages))
    bytes += m.content.size();
  if (limits.max_prompt_bytes > 0 && bytes > limits.max_prompt_bytes) {
    return bad("messages", std::to_string(bytes) + " bytes of content cannot fit the model's "
                           "context of " + std::to_string(limits.context_length) +
                           " tokens (at most " + std::to_string(limits.max_prompt_bytes) +
                           " bytes)");
  }
  static const ChatFormat kDefault;
  Result<std::vector<int32_t>> ids =
      chat_prompt_ids(limits.chat != nullptr ? *limits.chat : kDefault, *limits.tokenizer,
                      std::get<std::vector<text::ChatMessage>>(messages), add_generation_prompt);
  if (!ids.ok()) return bad("messages", ids.status().message());
  return std::move(*ids);
}

// A field accepted when absent, null or as `accepts` says; else refused with `why`.
struct FieldRule {
  const char* key;
  bool (*accepts)(const json&);
  const char* why;
};
std::optional<ApiError> refused_field(const json& j, std::span<const FieldRule> rules) {
  for (const FieldRule& r : rules) {
    if (j.contains(r.key) && !j[r.key].is_null() && !r.accepts(j[r.key])) {
      return bad(r.key, r.why);
    }
  }
  return std::nullopt;
}

// For a field of which only null (or absence) is accepted.
bool never(const json&) { return false; }

// The fields SGLang's and OpenAI's clients send with their "nothing" value, accepted as such;
// any other value asks for what kvrt does not do, refused by name.
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

// An error of the /generate request an OpenAI call was mapped to, naming the call's own field:
// the first of `names` whose /generate prefix the param starts with is replaced.
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

}  // namespace

std::variant<json, ApiError> tokenize_json(std::string_view body, const ModelLimits& limits) {
  auto parsed = read_object(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& j = std::get<json>(parsed);
  if (auto e = unknown_field(j, {"model", "prompt", "messages", "add_special_tokens",
                                 "add_generation_prompt", "return_token_strs"})) {
    return *e;
  }
  if (limits.tokenizer == nullptr) return ApiError{400, "the model has no tokenizer", ""};
  const bool chat = j.contains("messages");
  if (chat == j.contains("prompt")) return bad("prompt", "give prompt or messages, not both");
  // vLLM's defaults: a prompt gets the tokenizer's special tokens, a conversation only what the
  // template writes.
  bool add_special_tokens = !chat, add_generation_prompt = true, token_strs = false;
  for (auto [key, out] : {std::pair{"add_special_tokens", &add_special_tokens},
                          std::pair{"add_generation_prompt", &add_generation_prompt},
                          std::pair{"return_token_strs", &token_strs}}) {
    if (auto e = read_bool(j, key, out)) return *e;
  }
  std::vector<int32_t> ids;
  if (chat) {
    if (j.contains("add_special_tokens") && add_special_tokens) {
      return bad("add_special_tokens", "true is not supported with messages: the chat template "
                                       "writes the special tokens");
    }
    auto rendered = chat_ids(j, limits, add_generation_prompt);
    if (auto* e = std::get_if<ApiError>(&rendered)) return *e;
    ids = std::get<std::vector<int32_t>>(std::move(rendered));
  } else {
    if (!j["prompt"].is_string()) {
      return bad("prompt", "expected a string, found " + type_name(j["prompt"]));
    }
    ids = limits.tokenizer->encode(j["prompt"].get<std::string>(), add_special_tokens);
  }
  json answer = {{"count", ids.size()}, {"max_model_len", limits.context_length}, {"tokens", ids},
                 {"token_strs", nullptr}};
  if (token_strs) {
    json strs = json::array();
    for (int32_t id : ids) strs.push_back(limits.tokenizer->piece(id));
    answer["token_strs"] = std::move(strs);
  }
  return answer;
}

std::variant<json, ApiError> detokenize_json(std::string_view body, const ModelLimits& limits) {
  auto parsed = read_object(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& j = std::get<json>(parsed);
  if (auto e = unknown_field(j, {"model", "tokens"})) return *e;
  if (limits.tokenizer == nullptr) return ApiError{400, "the model has no tokenizer", ""};
  if (!j.contains("tokens")) return bad("tokens", "missing");
  auto ids = read_ids(j["tokens"], "tokens", limits.vocab_size);
  if (auto* e = std::get_if<ApiError>(&ids)) return *e;
  // As vLLM: transformers' decode, special tokens kept.
  text::DecodeOptions options;
  options.skip_special_tokens = false;
  return json{{"prompt", limits.tokenizer->decode(std::get<std::vector<int32_t>>(ids), options)}};
}

std::string error_body(const ApiError& e) {
  json error = {{"message", e.message}, {"type", e.type}, {"code", e.status}};
  error["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  return to_text(json{{"error", error}});
}

std::variant<GenerateCall, ApiError> parse_generate(std::string_view body,
                                                    const ModelLimits& limits) {
  auto parsed = read_object(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& j = std::get<json>(parsed);
  if (auto e = unknown_field(
          j, {"text", "input_ids", "sampling_params", "stream", "rid", "return_logprob",
              "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs", "modalities",
              "lora_path", "return_hidden_states", "image_data", "priority",
              "custom_logit_processor", "bootstrap_host", "bootstrap_port", "bootstrap_room"})) {
    return *e;
  }
  if (auto e = no_op(j)) return *e;
  GenerateCall call;
  call.tokenizer = limits.tokenizer;
  call.sampling = limits.defaults.sampling;
  call.max_new_tokens = limits.defaults.generate_max_new_tokens;
  // SGLang's log-probabilities: return_logprob, top_logprobs_num, return_text_in_logprobs;
  // logprob_start_len -1 (its default) asks for the output's alone.
  bool return_logprob = false;
  if (auto e = read_bool(j, "return_logprob", &return_logprob)) return *e;
  if (auto e = read_bool(j, "return_text_in_logprobs", &call.logprob_text)) return *e;
  if (j.contains("top_logprobs_num") && !j["top_logprobs_num"].is_null()) {
    const json& k = j["top_logprobs_num"];
    if (!k.is_number_integer() || k.get<int64_t>() < 0 || k.get<int64_t>() > INT32_MAX) {
      return bad("top_logprobs_num", "expected an integer >= 0, found " + k.dump());
    }
    if (return_logprob) call.sampling.logprobs = static_cast<int32_t>(k.get<int64_t>());
  }
  if (return_logprob && call.sampling.logprobs < 0) call.sampling.logprobs = 0;
  if (j.contains("logprob_start_len") && !j["logprob_start_len"].is_null()) {
    const json& s = j["logprob_start_len"];
    if (!s.is_number_integer()) return bad("logprob_start_len", "expected an integer");
    // -1: the output's only; p >= 0: the prompt's from position p on as well (checked
    // against the prompt by the serving core).
    if (return_logprob && s.get<int64_t>() >= 0) {
      if (s.get<int64_t>() > INT32_MAX) return bad("logprob_start_len", "too large");
      call.sampling.prompt_logprobs_from = static_cast<int32_t>(s.get<int64_t>());
    }
  }
  const bool has_text = j.contains("text") && !j["text"].is_null();
  const bool has_ids = j.contains("input_ids") && !j["input_ids"].is_null();
  if (has_text == has_ids) {
    return bad(has_text ? "input_ids" : "text", has_text ? "give text or input_ids, not both"
                                                         : "missing: give text or input_ids");
  }
  if (has_text) {
    const json& t = j["text"];
    std::vector<std::string> texts;
    if (t.is_string()) {
      texts.push_back(t.get<std::string>());
    } else if (t.is_array()) {
      call.batch = true;
      for (size_t i = 0; i < t.size(); ++i) {
        if (!t[i].is_string()) {
          return bad("text[" + std::to_string(i) + "]", "expected a string, found " +
                                                            type_name(t[i]));
        }
        texts.push_back(t[i].get<std::string>());
      }
    } else {
      return bad("text", "expected a string or a list of strings, found " + type_name(t));
    }
    call.text_prompt = true;
    if (limits.tokenizer == nullptr) return bad("text", "the model has no tokenizer: give input_ids");
    // Refused by its size before any of it is tokenized: a text past the bound can never fit.
    for (size_t i = 0; i < texts.size(); ++i) {
      if (limits.max_prompt_bytes > 0 && texts[i].size() > limits.max_prompt_bytes) {
        return bad(call.batch ? "text[" + std::to_string(i) + "]" : "text",
                   std::to_string(texts[i].size()) + " bytes cannot fit the model's context of " +
                       std::to_string(limits.context_length) + " tokens (at most " +
                       std::to_string(limits.max_prompt_bytes) + " bytes)");
      }
    }
    for (size_t i = 0; i < texts.size(); ++i) {
      std::vector<int32_t> ids = limits.tokenizer->encode(texts[i], /*add_bos=*/true);
      // Empty when it holds nothing but the special tokens the tokenizer adds (a BOS, for a
      // model that has one): a one-token text of a model without BOS (Qwen3's "Hi") is a prompt.
      if (ids.size() <= 2 && limits.tokenizer->encode(texts[i], /*add_bos=*/false).empty()) {
        return bad(call.batch ? "text[" + std::to_string(i) + "]" : "text", "the prompt is empty");
      }
      call.prompts.push_back(std::move(ids));
      call.prompt_texts.push_back(texts[i]);
    }
  } else {
    const json& ids = j["input_ids"];
    if (ids.is_array() && !ids.empty() && ids[0].is_array()) {
      call.batch = true;
      for (size_t i = 0; i < ids.size(); ++i) {
        auto one = read_ids(ids[i], "input_ids[" + std::to_string(i) + "]", 0);
        if (auto* e = std::get_if<ApiError>(&one)) return *e;
        call.prompts.push_back(std::move(std::get<std::vector<int32_t>>(one)));
      }
    } else {
      auto one = read_ids(ids, "input_ids", 0);
      if (auto* e = std::get_if<ApiError>(&one)) return *e;
      call.prompts.push_back(std::move(std::get<std::vector<int32_t>>(one)));
    }
  }
  if (call.prompts.empty()) return bad(has_text ? "text" : "input_ids", "the batch is empty");
  for (size_t i = 0; i < call.prompts.size(); ++i) {
    if (call.prompts[i].empty()) {
      return bad(std::string(has_text ? "text" : "input_ids") +
                     (call.batch ? "[" + std::to_string(i) + "]" : ""),
                 "the prompt is empty");
    }
  }

  if (j.contains("rid") && !j["rid"].is_null()) {
    const json& rid = j["rid"];
    if (rid.is_string() && !call.batch) {
      call.rids.push_back(rid.get<std::string>());
    } else if (rid.is_array() && call.batch && rid.size() == call.prompts.size()) {
      for (size_t i = 0; i < rid.size(); ++i) {
        if (!rid[i].is_string()) return bad("rid[" + std::to_string(i) + "]", "expected a string");
        call.rids.push_back(rid[i].get<std::string>());
      }
    } else {
      return bad("rid", call.batch ? "expected a list of strings, one per prompt"
                                   : "expected a string");
    }
  }
  call.rids.resize(call.prompts.size());
  if (j.contains("stream")) {
    if (!j["stream"].is_boolean()) return bad("stream", "expected true or false");
    call.stream = j["stream"].get<bool>();
    if (call.stream && call.batch) return bad("stream", "streaming a batch is not supported");
  }

  if (j.contains("sampling_params") && !j["sampling_params"].is_null()) {
    const json& sp = j["sampling_params"];
    if (!sp.is_object()) return bad("sampling_params", "expected an object");
    for (const auto& item : sp.items()) {
      const std::string key = item.key();
      const json& v = item.value();
      const std::string param = "sampling_params." + key;
      if (v.is_null()) continue;
      auto number = [&](double* out) -> std::optional<ApiError> {
        if (!v.is_number()) return bad(param, "expected a number, found " + type_name(v));
        *out = v.get<double>();
        if (!std::isfinite(*out)) return bad(param, "expected a finite number");
        return std::nullopt;
      };
      double x = 0;
      if (key == "max_new_tokens") {
        if (!v.is_number_integer()) return bad(param, "expected an integer, found " + type_name(v));
        if (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t{INT32_MAX}
                                   : v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX) {
          return bad(param, "expected an integer >= 0, found " + v.dump());
        }
        call.max_new_tokens = static_cast<int32_t>(v.get<int64_t>());
      } else if (key == "temperature") {
        if (auto e = number(&x)) return *e;
        call.sampling.temperature = static_cast<float>(x);
      } else if (key == "top_p") {
        if (auto e = number(&x)) return *e;
        call.sampling.top_p = static_cast<float>(x);
      } else if (key == "top_k") {
        if (!v.is_number_integer()) return bad(param, "expected an integer, found " + type_name(v));
        const int64_t k = v.get<int64_t>();
        // SGLang's -1 and kvrt's 0 both mean every token.
        if (k < -1 || k > INT32_MAX) return bad(param, "expected -1, 0 (all) or more");
        call.sampling.top_k = k < 0 ? 0 : static_cast<int32_t>(k);
      } else if (key == "min_p") {
        if (auto e = number(&x)) return *e;
        call.sampling.min_p = static_cast<float>(x);
      } else if (key == "seed" || key == "sampling_seed") {
        // SGLang's name is sampling_seed; OpenAI's (and vLLM's) seed. Both: one seed, twice.
        if (!v.is_number_integer()) return bad(param, "expected an integer, found " + type_name(v));
        const uint64_t seed =
            v.is_number_unsigned() ? v.get<uint64_t>() : static_cast<uint64_t>(v.get<int64_t>());
        if (call.seeded && seed != call.sampling.seed) {
          return bad(param, "seed and sampling_seed differ: give one");
        }
        call.sampling.seed = seed;
        call.seeded = true;
      } else if (key == "ignore_eos") {
        if (!v.is_boolean()) return bad(param, "expected true or false");
        call.ignore_eos = v.get<bool>();
      } else if (key == "stop_token_ids") {
        auto ids = read_ids(v, param, 0);
        if (auto* e = std::get_if<ApiError>(&ids)) return *e;
        call.stop_token_ids = std::get<std::vector<int32_t>>(ids);
      } else if (key == "stop") {
        if (v.is_string()) {
          call.stop.push_back(v.get<std::string>());
        } else if (v.is_array()) {
          for (const json& s : v) {
            if (!s.is_string()) return bad(param, "expected a string or a list of strings");
            call.stop.push_back(s.get<std::string>());
          }
        } else {
          return bad(param, "expected a string or a list of strings");
        }
        for (const std::string& s : call.stop) {
          if (s.empty()) return bad(param, "a stop string is empty");
        }
      } else if (key == "n") {
        if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > kMaxChoices) {
          return bad(param, "expected an integer from 1 to " + std::to_string(kMaxChoices) +
                                ", found " + v.dump());
        }
        call.n = static_cast<int32_t>(v.get<int64_t>());
      } else if (key == "frequency_penalty") {
        if (auto e = number(&x)) return *e;
        call.sampling.frequency_penalty = static_cast<float>(x);
      } else if (key == "presence_penalty") {
        if (auto e = number(&x)) return *e;
        call.sampling.presence_penalty = static_cast<float>(x);
      } else if (key == "repetition_penalty") {
        if (auto e = number(&x)) return *e;
        call.sampling.repetition_penalty = static_cast<float>(x);
      } else if (key == "min_new_tokens") {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
          return bad(param, "expected an integer >= 0, found " + v.dump());
        }
        call.sampling.min_tokens = static_cast<int32_t>(v.get<int64_t>());
      } else if (key == "logit_bias") {
        // {"<token id>": bias}, as OpenAI's.
        if (!v.is_object()) return bad(param, "expected an object of token id -> bias");
        for (auto it = v.begin(); it != v.end(); ++it) {
          int64_t id = -1;
          const std::string& k = it.key();
          const auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), id);
          if (ec != std::errc() || end != k.data() + k.size() || id < 0 || id > INT32_MAX) {
            return bad(param, "'" + k + "' is not a token id");
          }
          if (!it.value().is_number() || !std::isfinite(it.value().get<double>())) {
            return bad(param + "." + k, "expected a number");
          }
          call.sampling.logit_bias.emplace_back(static_cast<int32_t>(id),
                                                it.value().get<float>());
        }
      } else if (key == "no_stop_trim") {
        if (!v.is_boolean()) return bad(param, "expected true or false");
        call.no_stop_trim = v.get<bool>();
      } else if (key == "skip_special_tokens" || key == "spaces_between_special_tokens") {
        if (!v.is_boolean()) return bad(param, "expected true or false");
        // The output text always leaves special tokens out, as both default to.
        if (!v.get<bool>()) return bad(param, "only true is supported");
      } else if (key == "json_schema" || key == "regex" || key == "ebnf" ||
                 key == "structural_tag") {
        return bad(param, "constrained decoding is not supported yet");
      } else {
        return bad(param, "unknown sampling parameter");
      }
    }
  }
  if (call.stream && call.n > 1) {
    return bad("sampling_params.n", "streaming n > 1 is not supported on /generate (it is on "
                                    "/v1/completions)");
  }
  return call;
}

namespace {

// A conversation's length when the client sets none: the rest of the context (or of the pool),
// as OpenAI's, vLLM's and SGLang's chat do; at most defaults.chat_max_tokens when set. A prompt
// that leaves no room asks for 1 token, which the serving core then refuses naming the context.
int32_t conversation_length(const ModelLimits& limits, size_t prompt) {
  const int64_t most =
      limits.max_sequence_tokens > 0 ? limits.max_sequence_tokens : limits.context_length;
  // Nothing known of the model (a test's limits): /generate's length.
  int64_t rest = most > 0 ? std::max<int64_t>(most - static_cast<int64_t>(prompt), 1)
                          : limits.defaults.generate_max_new_tokens;
  if (limits.defaults.chat_max_tokens > 0) {
    rest = std::min<int64_t>(rest, limits.defaults.chat_max_tokens);
  }
  return static_cast<int32_t>(std::min<int64_t>(rest, INT32_MAX));
}

// The fields OpenAI's completions and chat share, mapped onto /generate's sampling_params so
// one checker serves both APIs.
std::variant<json, ApiError> openai_sampling(const json& j) {
  json sp = json::object();
  for (const auto& item : j.items()) {
    const std::string& k = item.key();
    const json& v = item.value();
    if (k == "max_tokens" || k == "max_completion_tokens") {
      sp["max_new_tokens"] = v;
    } else if (k == "temperature" || k == "top_p" || k == "seed" || k == "stop" || k == "n" ||
               k == "frequency_penalty" || k == "presence_penalty" || k == "top_k" ||
               k == "ignore_eos" || k == "min_p" || k == "repetition_penalty" ||
               k == "logit_bias") {
      sp[k] = v;
    } else if (k == "min_tokens") {
      sp["min_new_tokens"] = v;
    } else if (k == "tools" || k == "tool_choice" || k == "functions" || k == "function_call" ||
               k == "parallel_tool_calls") {
      // "None of them" is accepted; any tool is refused by name.
      const bool none = v.is_null() || (v.is_array() && v.empty()) || v == "none" ||
                        (k == "parallel_tool_calls" && v.is_boolean());
      if (!none) return bad(k, "tools are not supported: kvrt serves text completions only");
    } else if (k == "model" || k == "prompt" || k == "messages" || k == "stream" || k == "user" ||
               k == "stream_options" || k == "logprobs" || k == "echo" || k == "best_of" ||
               k == "response_format" || k == "priority" || k == "top_logprobs") {
      // handled by the caller (no_op: best_of 1, response_format text, user, priority)
    } else {
      return bad(k, "unknown field");
    }
  }
  return sp;
}

}  // namespace

std::variant<GenerateCall, ApiError> parse_openai(std::string_view body, const ModelLimits& limits,
                                                  bool chat) {
  auto parsed = read_object(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& j = std::get<json>(parsed);
  auto sampling = openai_sampling(j);
  if (auto* e = std::get_if<ApiError>(&sampling)) return *e;
  bool echo = false;
  if (auto e = read_bool(j, "echo", &echo)) return *e;
  if (echo && chat) return bad("echo", "unknown field (completions take echo)");
  if (echo && j.contains("stream") && j["stream"] == true) {
    return bad("echo", "echo is not supported when streaming yet");
  }
  // Completions: logprobs k (the chosen token's and the k likeliest); chat: logprobs true and
  // top_logprobs k.
  int32_t logprobs = -1;
  if (j.contains("logprobs") && !j["logprobs"].is_null() && j["logprobs"] != false) {
    const json& v = j["logprobs"];
    if (chat) {
      if (!v.is_boolean()) return bad("logprobs", "expected true or false");
      logprobs = 0;
    } else {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
        return bad("logprobs", "expected an integer >= 0, found " + v.dump());
      }
      logprobs = static_cast<int32_t>(v.get<int64_t>());
    }
  }
  if (j.contains("top_logprobs") && !j["top_logprobs"].is_null()) {
    const json& v = j["top_logprobs"];
    if (!chat) return bad("top_logprobs", "unknown field (completions take logprobs: k)");
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
      return bad("top_logprobs", "expected an integer >= 0, found " + v.dump());
    }
    if (logprobs < 0) return bad("top_logprobs", "needs logprobs: true");
    logprobs = static_cast<int32_t>(v.get<int64_t>());
  }
  if (auto e = no_op(j)) return *e;
  bool stream = false, include_usage = false;
  if (auto e = read_bool(j, "stream", &stream)) return *e;
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    const json& so = j["stream_options"];
    if (!stream) return bad("stream_options", "only allowed when stream is true");
    if (!so.is_object()) return bad("stream_options", "expected an object");
    for (auto it = so.begin(); it != so.end(); ++it) {
      if (it.key() != "include_usage") return bad("stream_options." + it.key(), "unknown field");
    }
    if (so.contains("include_usage") && !so["include_usage"].is_null()) {
      if (!so["include_usage"].is_boolean()) {
        return bad("stream_options.include_usage", "expected true or false");
      }
      include_usage = so["include_usage"].get<bool>();
    }
  }
  // The same request as /generate would see it, checked by the same code (a list of prompts
  // streams here, unlike on /generate: its choices are told apart by index).
  json generate = {{"sampling_params", std::get<json>(sampling)}};
  if (chat) {
    auto ids = chat_ids(j, limits, /*add_generation_prompt=*/true);
    if (auto* e = std::get_if<ApiError>(&ids)) return *e;
    generate["input_ids"] = std::get<std::vector<int32_t>>(ids);
  } else {
    if (!j.contains("prompt") || j["prompt"].is_null()) return bad("prompt", "missing");
    // OpenAI's four shapes: a string, a list of strings, a list of ids, a list of id lists.
    const json& p = j["prompt"];
    const bool texts = p.is_array() && !p.empty() && p[0].is_string();
    const bool id_lists = p.is_array() && !p.empty() && p[0].is_array();
    if (p.is_string() || texts) {
      generate["text"] = p;
    } else if (p.is_array() && !p.empty() && (p[0].is_number() || id_lists)) {
      generate["input_ids"] = p;
    } else {
      return bad("prompt", "expected a string, a list of strings, a list of token ids or a "
                           "list of lists of token ids");
    }
  }
  auto call = parse_generate(generate.dump(), limits);
  if (auto* e = std::get_if<ApiError>(&call)) {
    // Name the OpenAI field, not the /generate one it was mapped to.
    return renamed(*e, {{"sampling_params.max_new_tokens", "max_tokens"},
                        {"sampling_params.min_new_tokens", "min_tokens"},
                        {"sampling_params.", ""},
                        {"input_ids", chat ? "messages" : "prompt"},
                        {"text", chat ? "messages" : "prompt"}});
  }
  GenerateCall c = std::get<GenerateCall>(std::move(call));
  c.dialect = chat ? Dialect::kChat : Dialect::kCompletions;
  const bool length_given =
      (j.contains("max_tokens") && !j["max_tokens"].is_null()) ||
      (j.contains("max_completion_tokens") && !j["max_completion_tokens"].is_null());
  if (!length_given) {
    c.max_new_tokens = chat ? conversation_length(limits, c.prompts[0].size())
                            : limits.defaults.completions_max_tokens;
  }
  c.stream = stream;
  c.include_usage = include_usage;
  c.sampling.logprobs = logprobs;
  // echo: the answer starts with the prompt, and its log-probabilities with the prompt's.
  c.echo = echo;
  if (echo && logprobs >= 0) c.sampling.prompt_logprobs_from = 0;
  if (j.contains("best_of") && !j["best_of"].is_null()) {
    const json& b = j["best_of"];
    if (!b.is_number_integer() || b.get<int64_t>() < 1 || b.get<int64_t>() > kMaxChoices) {
      return bad("best_of", "expected an integer from 1 to " + std::to_string(kMaxChoices) +
                                ", found " + b.dump());
    }
    c.best_of = static_cast<int32_t>(b.get<int64_t>());
    if (c.best_of < c.n) return bad("best_of", "must be at least n (" + std::to_string(c.n) + ")");
    if (c.best_of > c.n && stream) {
      return bad("best_of", "best_of > n cannot stream: the best are known only at the end");
    }
  }
  if (j.contains("model") && j["model"].is_string()) c.model = j["model"].get<std::string>();
  return c;
}

std::variant<GenerateCall, ApiError> parse_responses(std::string_view body,
                                                     const ModelLimits& limits) {
  auto parsed = read_object(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& j = std::get<json>(parsed);
  if (auto e = unknown_field(j, {"model", "input", "instructions", "max_output_tokens",
                                 "temperature", "top_p", "stream", "user", "metadata", "store",
                                 "tools", "tool_choice", "parallel_tool_calls", "text",
                                 "reasoning", "previous_response_id", "truncation", "include",
                                 "service_tier", "background", "ignore_eos"})) {
    return *e;
  }
  static const FieldRule kRefusals[] = {
      {"tools", [](const json& v) { return v.is_array() && v.empty(); },
       "tools are not supported: kvrt serves text responses only"},
      {"tool_choice", [](const json& v) { return v == "none" || v == "auto"; },
       "tools are not supported"},
      {"reasoning", [](const json& v) { return v.is_object() && v.empty(); },
       "reasoning options are not supported"},
      {"previous_response_id", never,
       "responses are not stored, so none can be continued: send the conversation in input"},
      {"store", [](const json& v) { return v == false; },
       "responses are not stored: send store: false (and the conversation in input)"},
      {"background", [](const json& v) { return v == false; }, "background responses are not "
                                                              "supported"},
      {"truncation", [](const json& v) { return v == "disabled"; },
       "only \"disabled\" is supported: a conversation too long for the context is refused"},
      {"include", [](const json& v) { return v.is_array() && v.empty(); },
       "nothing can be included"},
      {"parallel_tool_calls", [](const json& v) { return v.is_boolean(); }, "expected a boolean"},
      {"user", [](const json& v) { return v.is_string(); }, "expected a string"},
      {"metadata", [](const json& v) { return v.is_object(); }, "expected an object"},
      {"service_tier", [](const json& v) { return v.is_string(); }, "expected a string"},
  };
  if (auto e = refused_field(j, kRefusals)) return *e;
  if (j.contains("text") && !j["text"].is_null()) {
    const json& t = j["text"];
    const bool text_format = t.is_object() && (!t.contains("format") ||
                                                (t["format"].is_object() &&
                                                 t["format"].contains("type") &&
                                                 t["format"]["type"] == "text"));
    if (!text_format) {
      return bad("text.format", "only {\"type\": \"text\"}: constrained decoding is not "
                                "built yet");
    }
  }
  // The conversation as chat messages: instructions first, as a system message.
  json messages = json::array();
  if (j.contains("instructions") && !j["instructions"].is_null()) {
    if (!j["instructions"].is_string()) return bad("instructions", "expected a string");
    messages.push_back({{"role", "system"}, {"content", j["instructions"]}});
  }
  if (!j.contains("input") || j["input"].is_null()) return bad("input", "missing");
  const json& input = j["input"];
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
  } else if (input.is_array() && !input.empty()) {
    for (size_t i = 0; i < input.size(); ++i) {
      const json& item = input[i];
      const std::string at = "input[" + std::to_string(i) + "]";
      if (!item.is_object()) return bad(at, "expected a message {role, content}");
      // (A type that is not a string is no type kvrt knows: refused below by name.)
      const std::string type = !item.contains("type") ? "message"
                               : item["type"].is_string() ? item["type"].get<std::string>()
                                                          : item["type"].dump();
      if (type != "message") {
        return bad(at + ".type", "'" + type + "' items are not supported (only messages: no "
                                 "tools or reasoning)");
      }
      if (!item.contains("role") || !item["role"].is_string()) {
        return bad(at + ".role", "expected user, assistant, system or developer");
      }
      std::string role = item["role"];
      if (role == "developer") role = "system";  // the chat templates know system
      if (!item.contains("content")) return bad(at + ".content", "missing");
      auto content = text_content(item["content"], at + ".content", {"input_text", "output_text"},
                                  " (only input_text and output_text: a text model)",
                                  /*strict=*/false);
      if (auto* e = std::get_if<ApiError>(&content)) return *e;
      messages.push_back({{"role", role}, {"content", std::get<std::string>(content)}});
    }
  } else {
    return bad("input", "expected a string or a non-empty list of messages");
  }
  // The Responses API has no empty answer (OpenAI's floor is 16 tokens): 0 stays refused there.
  if (j.contains("max_output_tokens") && j["max_output_tokens"].is_number_integer() &&
      j["max_output_tokens"].get<int64_t>() < 1) {
    return bad("max_output_tokens",
               "expected an integer >= 1, found " + j["max_output_tokens"].dump());
  }
  json sp = json::object();
  for (auto [from, to] : {std::pair{"max_output_tokens", "max_new_tokens"},
                          std::pair{"temperature", "temperature"}, std::pair{"top_p", "top_p"},
                          std::pair{"ignore_eos", "ignore_eos"}}) {
    if (j.contains(from) && !j[from].is_null()) sp[to] = j[from];
  }
  bool stream = false;
  if (auto e = read_bool(j, "stream", &stream)) return *e;
  auto ids = chat_ids(json{{"messages", messages}}, limits, /*add_generation_prompt=*/true);
  if (auto* e = std::get_if<ApiError>(&ids)) {
    ApiError error = *e;
    if (error.param.rfind("messages", 0) == 0) error.param = "input";
    return error;
  }
  auto call = parse_generate(
      json{{"input_ids", std::get<std::vector<int32_t>>(ids)}, {"sampling_params", sp}}.dump(),
      limits);
  if (auto* e = std::get_if<ApiError>(&call)) {
    return renamed(*e, {{"sampling_params.max_new_tokens", "max_output_tokens"},
                        {"sampling_params.", ""}});
  }
  GenerateCall c = std::get<GenerateCall>(std::move(call));
  c.dialect = Dialect::kResponses;
  if (!j.contains("max_output_tokens") || j["max_output_tokens"].is_null()) {
    c.max_new_tokens = conversation_length(limits, c.prompts[0].size());
  }
  c.stream = stream;
  if (j.contains("model") && j["model"].is_string()) c.model = j["model"].get<std::string>();
  if (j.contains("instructions") && j["instructions"].is_string()) {
    c.instructions = j["instructions"].get<std::string>();
  }
  if (j.contains("metadata") && j["metadata"].is_object()) c.metadata = j["metadata"];
  c.max_tokens_given = j.contains("max_output_tokens") && !j["max_output_tokens"].is_null();
  return c;
}

uint64_t choice_seed(uint64_t seed, size_t choice) {
  if (choice == 0) return seed;
  // splitmix64 of (seed, choice): choices of nearby seeds share no stream, as seed + j would
  // (seed 7's second choice would be seed 8's first).
  uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (static_cast<uint64_t>(choice) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

uint64_t prompt_byte_bound(const text::Tokenizer& tokenizer, int64_t context_length) {
  size_t longest = 1;
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    longest = std::max(longest, tokenizer.piece(id).size());
  }
  return static_cast<uint64_t>(std::max<int64_t>(context_length, 1)) * longest;
}

}  // namespace kvrt::server
