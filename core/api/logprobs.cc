#include "core/api/logprobs.h"

#include <vector>

#include "core/text/utf8.h"
#include "core/util/text.h"

namespace kvrt::api {

using nlohmann::json;

std::string token_text(const GenerateCall& call, int32_t id) {
  if (call.tokenizer == nullptr) return "";
  text::DecodeOptions options;
  options.skip_special_tokens = false;
  const int32_t one[] = {id};
  return call.tokenizer->decode(one, options);
}

json completions_logprobs(const GenerateCall& call, std::span<const sampling::SampledLogprobs> entries,
                          size_t offset) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
       offsets = json::array();
  for (const sampling::SampledLogprobs& e : entries) {
    const std::string text = token_text(call, e.chosen.id);
    tokens.push_back(text);
    token_logprobs.push_back(e.chosen.logprob);
    // The k likeliest and, always, the chosen one (up to k + 1 entries, as OpenAI's).
    json alternatives = json::object();
    for (const sampling::TokenLogprob& t : e.top) alternatives[token_text(call, t.id)] = t.logprob;
    alternatives[text] = e.chosen.logprob;
    top.push_back(std::move(alternatives));
    offsets.push_back(offset);
    offset += text::utf8_characters(text);  // Python's len(), as OpenAI counts
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top},
          {"text_offset", offsets}};
}

namespace {

json chat_logprob_entry(const GenerateCall& call, const sampling::TokenLogprob& t) {
  const std::string text = token_text(call, t.id);
  std::vector<int> bytes;
  for (char c : text) bytes.push_back(static_cast<unsigned char>(c));
  return {{"token", text}, {"logprob", t.logprob}, {"bytes", bytes}};
}

}  // namespace

json chat_logprobs(const GenerateCall& call, std::span<const sampling::SampledLogprobs> entries) {
  json content = json::array();
  for (const sampling::SampledLogprobs& e : entries) {
    json entry = chat_logprob_entry(call, e.chosen);
    json top = json::array();
    for (const sampling::TokenLogprob& t : e.top) top.push_back(chat_logprob_entry(call, t));
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  return {{"content", content}, {"refusal", nullptr}};
}

json sglang_tuple(const GenerateCall& call, const sampling::TokenLogprob& t) {
  return json::array({t.logprob, t.id, call.logprob_text ? json(token_text(call, t.id)) : json()});
}

}  // namespace kvrt::api
