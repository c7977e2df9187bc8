#include "core/api/prompt.h"

#include <algorithm>
#include <string>
#include <utility>

#include "core/api/body.h"

namespace kvrt::api {

using nlohmann::json;

std::variant<std::vector<ChatMessage>, ApiError> read_chat_messages(const json& j) {
  if (!j.contains("messages") || !j["messages"].is_array() || j["messages"].empty()) {
    return bad("messages", "expected a non-empty list of {role, content}");
  }
  std::vector<ChatMessage> messages;
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

std::optional<ApiError> check_conversation(const std::vector<ChatMessage>& messages,
                                           const ModelLimits& limits) {
  if (limits.tokenizer == nullptr) return bad("messages", "the model has no tokenizer");
  // Refused by its size before it is rendered and tokenized, as a text prompt is.
  uint64_t bytes = 0;
  for (const ChatMessage& m : messages) bytes += m.content.size();
  if (limits.max_prompt_bytes > 0 && bytes > limits.max_prompt_bytes) {
    return bad("messages", std::to_string(bytes) + " bytes of content cannot fit the model's "
                           "context of " + std::to_string(limits.context_length) +
                           " tokens (at most " + std::to_string(limits.max_prompt_bytes) +
                           " bytes)");
  }
  return std::nullopt;
}

std::optional<ApiError> template_variables(const json& j, text::TemplateVariables* out) {
  auto kwargs = j.find("chat_template_kwargs");
  if (kwargs == j.end()) return std::nullopt;
  if (std::optional<VariableError> e = read_template_variables(*kwargs, out)) {
    return bad(e->at("chat_template_kwargs"), e->why);
  }
  return std::nullopt;
}

std::variant<std::vector<int32_t>, ApiError> conversation_ids(
    const std::vector<ChatMessage>& messages, const ModelLimits& limits,
    bool add_generation_prompt, const text::TemplateVariables& variables) {
  static const ChatFormat kDefault;
  Result<std::vector<int32_t>> ids =
      chat_prompt_ids(limits.chat != nullptr ? *limits.chat : kDefault, *limits.tokenizer,
                      messages, add_generation_prompt, variables);
  if (!ids.ok()) return bad("messages", ids.status().message());
  return std::move(*ids);
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

}  // namespace

std::optional<ApiError> tokenize_prompts(GenerateCall* call, const ModelLimits& limits) {
  if (!call->messages.empty()) {
    auto ids = conversation_ids(call->messages, limits, /*add_generation_prompt=*/true,
                                call->template_variables);
    if (auto* e = std::get_if<ApiError>(&ids)) {
      ApiError error = *e;
      if (call->dialect == Dialect::kResponses) error.param = "input";
      return error;
    }
    call->prompts = {std::get<std::vector<int32_t>>(std::move(ids))};
  } else if (call->text_prompt && call->prompts.empty()) {
    // Completions name their prompt "prompt", /generate "text".
    const std::string name = call->dialect == Dialect::kCompletions ? "prompt" : "text";
    const std::vector<std::string>& texts = call->prompt_texts;
    for (size_t i = 0; i < texts.size(); ++i) {
      std::vector<int32_t> ids = limits.tokenizer->encode(texts[i], /*add_bos=*/true);
      // Empty when it holds nothing but the special tokens the tokenizer adds (a BOS, for a
      // model that has one): a one-token text of a model without BOS (Qwen3's "Hi") is a prompt.
      if (ids.size() <= 2 && limits.tokenizer->encode(texts[i], /*add_bos=*/false).empty()) {
        return bad(call->batch ? name + "[" + std::to_string(i) + "]" : name,
                   "the prompt is empty");
      }
      call->prompts.push_back(std::move(ids));
    }
  }
  if (call->length_from_context && !call->prompts.empty()) {
    call->max_new_tokens = conversation_length(limits, call->prompts[0].size());
  }
  return std::nullopt;
}

}  // namespace kvrt::api
