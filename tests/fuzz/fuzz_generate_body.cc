// The bodies of POST /generate, /v1/completions, /v1/chat/completions, /tokenize and /detokenize
// (kvrt serve): every field checked by parse_generate / parse_openai / tokenize_json /
// detokenize_json, against a 512-token byte tokenizer and a 2048-token context; a call that
// passes is answered as JSON in its API's shape.
#include <cstdint>
#include <string_view>

#include "core/model/tokenizer.h"
#include "core/server/api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto tokenizer = kvrt::model::make_byte_tokenizer(512).value().release();
  kvrt::server::ModelLimits limits;
  limits.tokenizer = tokenizer;
  limits.vocab_size = 512;
  limits.context_length = 2048;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (auto answer : {kvrt::server::tokenize_json(body, limits),
                      kvrt::server::detokenize_json(body, limits)}) {
    if (auto* e = std::get_if<kvrt::server::ApiError>(&answer)) {
      (void)kvrt::server::error_body(*e);
    } else {
      (void)kvrt::server::to_text(std::get<nlohmann::json>(answer));
    }
  }
  for (int api = 0; api < 3; ++api) {
    auto call = api == 0 ? kvrt::server::parse_generate(body, limits)
                         : kvrt::server::parse_openai(body, limits, /*chat=*/api == 2);
    if (auto* e = std::get_if<kvrt::server::ApiError>(&call)) {
      (void)kvrt::server::error_body(*e);
      continue;
    }
    const auto& c = std::get<kvrt::server::GenerateCall>(call);
    kvrt::server::GenerateResult r;
    r.output_ids = c.prompts.front();
    r.text = tokenizer->decode(r.output_ids);
    r.finished = true;
    std::string matched;
    (void)kvrt::server::find_stop(r.text, c.stop, &matched);
    (void)kvrt::server::stop_safe_length(r.text, c.stop);
    (void)kvrt::server::to_text(kvrt::server::generate_json(r));
    (void)kvrt::server::to_text(kvrt::server::openai_json(c, {r}, "cmpl-1", 0));
    (void)kvrt::server::to_text(kvrt::server::openai_chunk(c, r, r.text, "cmpl-1", 0));
  }
  return 0;
}
