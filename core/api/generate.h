// SGLang's POST /generate: the body read into a GenerateCall (read_generate; parse_generate also
// tokenizes its text prompts), and the JSON a call is answered with, whole or as stream events.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <variant>

#include "core/api/protocol.h"

namespace kvrt::api {

// The body parsed and its shape checked: types, a prompt given exactly once, valid UTF-8, a text
// prompt within max_prompt_bytes, nothing after the JSON (a NUL byte included), numbers a double
// holds (1e309 is refused naming its field). What the body leaves unset is limits.defaults'. The
// values (ids inside the vocabulary, max_new_tokens and the sampling parameters in range, the
// prompt inside the context and the pool) are the serving core's to check
// (ServingCore::check_request), once.
// Its text prompts are left in prompt_texts for tokenize_prompts (prompt.h), the call's next
// step.
std::variant<GenerateCall, ApiError> read_generate(std::string_view body,
                                                   const ModelLimits& limits);
// read_generate for a body of every field but the prompt (text, input_ids, rid): a conversation
// the caller reads (OpenAI's chat and the Responses API map their fields onto /generate's).
std::variant<GenerateCall, ApiError> read_generate_fields(std::string_view body,
                                                          const ModelLimits& limits);
// read_generate, then tokenize_prompts: the call ready to submit (the tests' and fuzzers' way).
std::variant<GenerateCall, ApiError> parse_generate(std::string_view body,
                                                    const ModelLimits& limits);

// {"text", "output_ids", "meta_info": {id, prompt_tokens, completion_tokens, cached_tokens,
// finish_reason, e2e_latency}}, SGLang's shape; finish_reason is null while unfinished, else
// {"type": "length", "length"}, {"type": "stop", "matched": id or string} or {"type": "abort",
// "message"}.
// output_ids holds the ids from `ids_from` on and text the bytes from `text_from` on (0, 0: the
// whole answer so far, as SGLang streams it; a stream with incremental output gives the new
// ones).
// What generate_event kept of a stream's earlier events: the output ids and the text so far,
// already in JSON, so each event adds only what is new.
struct GenerateEventCache {
  size_t ids = 0;  // output ids in ids_text
  std::string ids_text;  // "1,2,3"
  size_t text = 0;       // bytes of the text in text_json
  std::string text_json;  // the text escaped, without quotes
  bool valid = true;      // that text is valid UTF-8 (else it is escaped whole each time)
};
// to_text(generate_json(call, result)) exactly, at a cost that does not grow with the ids and
// text already sent (SGLang's streams carry everything so far in every event).
std::string generate_event(const GenerateCall& call, const GenerateResult& result,
                           GenerateEventCache* cache);

// With log-probabilities asked for, meta_info has SGLang's output_token_logprobs and
// output_top_logprobs as (logprob, id, text or null) tuples, from ids_from on.
nlohmann::json generate_json(const GenerateCall& call, const GenerateResult& result,
                             size_t ids_from = 0, size_t text_from = 0);

}  // namespace kvrt::api
