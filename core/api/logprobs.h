// Log-probabilities in each API's shape: OpenAI completions' (tokens, token_logprobs,
// top_logprobs, text_offset), OpenAI chat's (content entries with bytes), SGLang's tuples.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <span>
#include <string>

#include "core/api/protocol.h"
#include "core/sampling/sampler.h"

namespace kvrt::api {

// A token's text beside its log-probability: the id decoded alone, special tokens kept ("" with
// no tokenizer).
std::string token_text(const GenerateCall& call, int32_t id);
// OpenAI completions' logprobs object for `entries`, text_offset counted from `offset`.
nlohmann::json completions_logprobs(const GenerateCall& call,
                                    std::span<const sampling::SampledLogprobs> entries,
                                    size_t offset);
// OpenAI chat's logprobs object: {"content": [{token, logprob, bytes, top_logprobs}]}.
nlohmann::json chat_logprobs(const GenerateCall& call,
                             std::span<const sampling::SampledLogprobs> entries);
// SGLang's (logprob, id, text or null) tuple.
nlohmann::json sglang_tuple(const GenerateCall& call, const sampling::TokenLogprob& t);

}  // namespace kvrt::api
