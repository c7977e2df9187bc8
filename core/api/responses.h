// OpenAI's POST /v1/responses (its text subset): the body read into a GenerateCall, and the
// answer, whole or as the Responses stream's named events.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <variant>

#include "core/api/protocol.h"

namespace kvrt::api {

// POST /v1/responses, OpenAI's Responses API, its text subset: `input` (a string, or a list of
// messages whose content is a string or input_text / output_text parts), `instructions` (a
// system message first), max_output_tokens, temperature, top_p, stream, through the chat
// template. Tools, reasoning, stored responses (previous_response_id, store true) and formats
// other than text are refused by name.
// read_responses leaves the conversation for tokenize_prompts (prompt.h); parse_responses
// does both steps.
std::variant<GenerateCall, ApiError> read_responses(std::string_view body,
                                                    const ModelLimits& limits);
std::variant<GenerateCall, ApiError> parse_responses(std::string_view body,
                                                     const ModelLimits& limits);

// The Responses API's answer: a "response" object (status "completed", or "incomplete" with
// incomplete_details.reason "max_output_tokens") with one assistant message of output_text,
// and usage (input_tokens, output_tokens, cached tokens). `id` is the response's ("resp_...").
nlohmann::json responses_json(const GenerateCall& call, const GenerateResult& result,
                              const std::string& id, int64_t created);
// A Responses stream's event: {"type", "sequence_number", ...fields}; its SSE text is
// "event: <type>\ndata: <json>\n\n" (sse_event).
nlohmann::json responses_event(const std::string& type, int64_t sequence,
                               nlohmann::json fields);
std::string sse_event(const nlohmann::json& event);

}  // namespace kvrt::api
