#include "core/api/tokenize.h"

#include <utility>

#include "core/api/body.h"
#include "core/api/prompt.h"

namespace kvrt::api {

using nlohmann::json;

std::variant<json, ApiError> tokenize_json(std::string_view body, const ModelLimits& limits) {
  auto parsed = read_object(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& j = std::get<json>(parsed);
  if (auto e = unknown_field(j, {"model", "prompt", "messages", "add_special_tokens",
                                 "add_generation_prompt", "return_token_strs",
                                 "chat_template_kwargs"})) {
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
    auto messages = read_chat_messages(j);
    if (auto* e = std::get_if<ApiError>(&messages)) return *e;
    const auto& conversation = std::get<std::vector<ChatMessage>>(messages);
    if (auto e = check_conversation(conversation, limits)) return *e;
    text::TemplateVariables variables;
    if (auto e = template_variables(j, &variables)) return *e;
    auto rendered = conversation_ids(conversation, limits, add_generation_prompt, variables);
    if (auto* e = std::get_if<ApiError>(&rendered)) return *e;
    ids = std::get<std::vector<int32_t>>(std::move(rendered));
  } else {
    if (j.contains("chat_template_kwargs")) {
      return bad("chat_template_kwargs", "is for messages: a prompt is not rendered by a template");
    }
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

}  // namespace kvrt::api
