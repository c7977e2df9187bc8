// The bodies of POST /generate, /v1/completions, /v1/chat/completions, /v1/responses, /tokenize
// and /detokenize (kvrt serve): every field checked by parse_generate / parse_openai /
// parse_responses / tokenize_json / detokenize_json, against a 512-token byte tokenizer and a
// 2048-token context; each prompt of a call that passes goes through the scheduler's check
// (sched::check_request) and, as if it were the output, through the output text with the call's
// stop strings; the call is answered as JSON in its API's shape.
#include <cstdint>
#include <string_view>

#include "core/api/generate.h"
#include "core/api/openai.h"
#include "core/api/responses.h"
#include "core/api/tokenize.h"
#include "core/sched/scheduler.h"
#include "core/text/detokenizer.h"
#include "core/text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto tokenizer = kvrt::text::make_byte_tokenizer(512).value().release();
  kvrt::api::ModelLimits limits;
  limits.tokenizer = tokenizer;
  limits.vocab_size = 512;
  limits.context_length = 2048;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (auto answer : {kvrt::api::tokenize_json(body, limits),
                      kvrt::api::detokenize_json(body, limits)}) {
    if (auto* e = std::get_if<kvrt::api::ApiError>(&answer)) {
      (void)kvrt::api::error_body(*e);
    } else {
      (void)kvrt::api::to_text(std::get<nlohmann::json>(answer));
    }
  }
  for (int api = 0; api < 4; ++api) {
    auto call = api == 0   ? kvrt::api::parse_generate(body, limits)
                : api == 3 ? kvrt::api::parse_responses(body, limits)
                           : kvrt::api::parse_openai(body, limits, /*chat=*/api == 2);
    if (auto* e = std::get_if<kvrt::api::ApiError>(&call)) {
      (void)kvrt::api::error_body(*e);
      continue;
    }
    const auto& c = std::get<kvrt::api::GenerateCall>(call);
    kvrt::sched::SchedulerOptions so;
    so.num_pages = 128;
    so.page_size = 16;
    so.vocab_size = 512;
    so.max_context = 2048;
    bool servable = true;
    for (const auto& prompt : c.prompts) {
      kvrt::sched::RequestSpec spec;
      spec.prompt = prompt;
      spec.max_new_tokens = c.max_new_tokens;
      servable = servable && kvrt::sched::check_request(so, spec).ok();
    }
    if (!servable) continue;  // refused with a 400 before any of it is decoded
    kvrt::api::GenerateResult r;
    kvrt::text::OutputText text(tokenizer, {}, c.stop);
    // The streamed event built from the escaped pieces is the whole dump, byte for byte, at
    // every step (the first 64) and at the end.
    kvrt::api::GenerateEventCache cache;
    std::vector<int32_t> so_far;
    for (int32_t id : c.prompts.front()) {
      so_far.push_back(id);
      r.output_ids.push_back(id);
      // As the sampler would report it, when asked: the id and the next as an alternative.
      r.logprobs.push_back({{id, -0.5f}, {{id, -0.5f}, {(id + 1) % 512, -1.5f}}});
      const bool stopped = text.update(so_far);
      r.text += text.take();
      if (r.output_ids.size() <= 64 &&
          kvrt::api::generate_event(c, r, &cache) !=
              kvrt::api::to_text(kvrt::api::generate_json(c, r))) {
        __builtin_trap();
      }
      if (stopped) break;
    }
    text.finish(so_far);
    r.text += text.take();
    r.finished = true;
    if (kvrt::api::generate_event(c, r, &cache) !=
        kvrt::api::to_text(kvrt::api::generate_json(c, r))) {
      __builtin_trap();
    }
    (void)kvrt::api::to_text(kvrt::api::openai_json(c, {r}, "cmpl-1", 0));
    (void)kvrt::api::to_text(
        kvrt::api::openai_chunk(c, r, r.text, "cmpl-1", 0, 0, r.logprobs, 0));
    (void)kvrt::api::to_text(kvrt::api::responses_json(c, r, "resp_1", 0));
  }
  return 0;
}
