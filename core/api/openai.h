// OpenAI's POST /v1/completions and /v1/chat/completions, which share one body shape: the body
// mapped onto /generate's fields and read as read_generate reads them, and the answers (a
// "text_completion" or "chat.completion", its stream chunks, and the errors OpenAI's way).
#pragma once

#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/api/protocol.h"

namespace kvrt::api {

// POST /v1/completions (`chat` false: "prompt", a string or a list of token ids) and
// /v1/chat/completions (`chat` true: "messages" through the chat template): OpenAI's fields
// (max_tokens, temperature, top_p, seed, stop, stream, n = 1), checked as parse_generate does.
// read_openai leaves the prompt text and the conversation for tokenize_prompts (prompt.h);
// parse_openai does both steps.
std::variant<GenerateCall, ApiError> read_openai(std::string_view body, const ModelLimits& limits,
                                                 bool chat);
std::variant<GenerateCall, ApiError> parse_openai(std::string_view body, const ModelLimits& limits,
                                                  bool chat);

// OpenAI's answer for a finished call (`results` in prompt order, none aborted: an aborted one
// is answered with openai_abort_error): a "text_completion" or a "chat.completion" with choices
// whose finish_reason is OpenAI's "stop" or "length", and usage; `created` is the Unix time.
nlohmann::json openai_json(const GenerateCall& call, const std::vector<GenerateResult>& results,
                           const std::string& id, int64_t created);
// An aborted or failed request as OpenAI answers errors: 500 for an engine failure, 503 for an
// abort (shutdown, timeout, /abort_request), with the reason; a stream sends it as an event.
ApiError openai_abort_error(const GenerateResult& result);
// One streamed chunk of choice `index`: `delta` is the text since the last chunk, `logprobs`
// those of the ids since then (completions' text_offset counted from `text_offset`);
// finish_reason when finished; "usage": null when the call asked for usage
// (stream_options.include_usage).
nlohmann::json openai_chunk(const GenerateCall& call, const GenerateResult& result,
                            const std::string& delta, const std::string& id, int64_t created,
                            size_t index, std::span<const sampling::SampledLogprobs> logprobs = {},
                            size_t text_offset = 0);
// The last chunk of a stream that asked for usage: no choices, the call's usage.
nlohmann::json openai_usage_chunk(const GenerateCall& call,
                                  const std::vector<GenerateResult>& results,
                                  const std::string& id, int64_t created);

}  // namespace kvrt::api
