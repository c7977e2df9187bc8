// What a request of kvrt serve's API leaves unset (defaults.h): the model
// directory's generation_config.json where it says, OpenAI's and SGLang's defaults elsewhere,
// and how /get_server_info reports them.
#include "core/api/defaults.h"
#include "core/util/text.h"

namespace kvrt::api {

using nlohmann::json;

RequestDefaults request_defaults(const model::GenerationConfig& g) {
  RequestDefaults d;
  if (g.path.empty()) return d;
  d.source = g.path;
  sampling::SamplingParams& p = d.sampling;
  if (g.temperature) p.temperature = static_cast<float>(*g.temperature);
  if (g.top_p) p.top_p = static_cast<float>(*g.top_p);
  if (g.top_k) p.top_k = *g.top_k < 0 ? 0 : static_cast<int32_t>(*g.top_k);
  if (g.min_p) p.min_p = static_cast<float>(*g.min_p);
  if (g.repetition_penalty) p.repetition_penalty = static_cast<float>(*g.repetition_penalty);
  // transformers samples only with do_sample true; false is greedy whatever the temperature.
  if (g.do_sample == false) p.temperature = 0.0f;
  if (g.max_new_tokens) {
    const auto n = static_cast<int32_t>(*g.max_new_tokens);
    d.generate_max_new_tokens = d.completions_max_tokens = d.chat_max_tokens = n;
  }
  return d;
}

json defaults_json(const RequestDefaults& d) {
  const sampling::SamplingParams& p = d.sampling;
  // Each float as its shortest decimal (0.6, not 0.6000000238418579), as the file wrote it.
  const auto shortest = util::shortest_decimal;
  return {{"temperature", shortest(p.temperature)},
          {"top_p", shortest(p.top_p)},
          {"top_k", p.top_k == 0 ? -1 : p.top_k},
          {"min_p", shortest(p.min_p)},
          {"repetition_penalty", shortest(p.repetition_penalty)},
          {"max_new_tokens", d.generate_max_new_tokens},
          {"completions_max_tokens", d.completions_max_tokens},
          {"chat_max_tokens", d.chat_max_tokens > 0 ? json(d.chat_max_tokens) : json(nullptr)},
          {"source", d.source}};
}

}  // namespace kvrt::api
