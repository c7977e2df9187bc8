// vLLM's POST /tokenize and /detokenize: text or a conversation to ids, ids to text.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>
#include <variant>

#include "core/api/protocol.h"

namespace kvrt::api {

// POST /tokenize in vLLM's shape: {"model"?, "prompt": "...", "add_special_tokens"? (default
// true)} or {"model"?, "messages": [...], "add_generation_prompt"? (default true)} rendered by
// the chat template as /v1/chat/completions does, "return_token_strs"? (each id's piece) ->
// {"count", "max_model_len", "tokens", "token_strs"}.
std::variant<nlohmann::json, ApiError> tokenize_json(std::string_view body,
                                                     const ModelLimits& limits);
// POST /detokenize: {"model"?, "tokens": [...]} -> {"prompt": "..."}, special tokens kept as
// transformers' decode does (vLLM's answer).
std::variant<nlohmann::json, ApiError> detokenize_json(std::string_view body,
                                                       const ModelLimits& limits);

}  // namespace kvrt::api
