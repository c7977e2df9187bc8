// A call's prompt step, between reading its body and submitting it: the conversation read from
// "messages", rendered by the chat template and tokenized, or the text prompts tokenized.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <variant>
#include <vector>

#include "core/api/protocol.h"

namespace kvrt::api {

// j["messages"]: a non-empty list of {"role", "content"} strings (OpenAI chat's messages).
std::variant<std::vector<ChatMessage>, ApiError> read_chat_messages(const nlohmann::json& j);

// The conversation's contents within limits.max_prompt_bytes (refused naming "messages" before
// it is rendered), and a tokenizer to render it with.
std::optional<ApiError> check_conversation(const std::vector<ChatMessage>& messages,
                                           const ModelLimits& limits);
// The request's chat_template_kwargs (absent: none), or a 400 naming the field.
std::optional<ApiError> template_variables(const nlohmann::json& j,
                                           text::TemplateVariables* out);
// The prompt ids of a conversation through the served chat template (kvrt's default when the
// server has none); a template's error names "messages".
std::variant<std::vector<int32_t>, ApiError> conversation_ids(
    const std::vector<ChatMessage>& messages, const ModelLimits& limits,
    bool add_generation_prompt, const text::TemplateVariables& variables = {});

// The call's prompts as ids: its conversation (call->messages) rendered and tokenized, or each
// of its text prompts (call->prompt_texts when call->text_prompt) tokenized with the tokenizer's
// special tokens; a prompt of nothing but those is refused as empty, naming the call's field
// ("text[i]", "prompt[i]", "messages", or "input" for the Responses API). Then a call that set
// no length gets the rest of the context (length_from_context). Ids given as ids are left as
// they are.
std::optional<ApiError> tokenize_prompts(GenerateCall* call, const ModelLimits& limits);

}  // namespace kvrt::api
