// What a request that leaves a value unset gets: the model directory's generation_config.json
// where it says, SGLang's and OpenAI's defaults elsewhere, and how /get_server_info reports them.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/sampling/sampler.h"
#include "core/model/generation_config.h"

namespace kvrt::api {

// What a request that leaves a value unset gets, as SGLang's and vLLM's servers give it: the
// model directory's generation_config.json where it says (request_defaults), else temperature 1
// with no top-k, top-p or min-p cut (greedy only when asked for, with temperature 0).
struct RequestDefaults {
  sampling::SamplingParams sampling{.temperature = 1.0f};
  // The length: /generate's max_new_tokens (SGLang's 128), completions' max_tokens (OpenAI's and
  // vLLM's 16); chat and the Responses API run to the end of the context (ModelLimits::
  // max_sequence_tokens less the prompt) as OpenAI's, vLLM's and SGLang's do, or at most
  // chat_max_tokens when it is above 0. generation_config.json's max_new_tokens sets all three.
  int32_t generate_max_new_tokens = 128;
  int32_t completions_max_tokens = 16;
  int32_t chat_max_tokens = 0;
  // Where they came from: "<path>/generation_config.json" or kvrt's own (SGLang's and OpenAI's).
  std::string source = "SGLang's and OpenAI's defaults (no generation_config.json)";
};
// The defaults with generation_config.json's values over them (temperature, top_p, top_k, min_p,
// repetition_penalty, max_new_tokens; do_sample false: greedy). `generation.path` "": none.
RequestDefaults request_defaults(const model::GenerationConfig& generation);
// {"temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_new_tokens",
// "completions_max_tokens", "chat_max_tokens" (null: the rest of the context), "source"}: what
// /get_server_info says of them.
nlohmann::json defaults_json(const RequestDefaults& defaults);

}  // namespace kvrt::api
