// The body of POST /generate (kvrt serve): every field checked by parse_generate, against a
// 512-token byte tokenizer and a 2048-token context; a call that passes is answered as JSON.
#include <cstdint>
#include <string_view>

#include "core/model/tokenizer.h"
#include "core/server/api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto tokenizer = kvrt::model::make_byte_tokenizer(512).value().release();
  const kvrt::server::ModelLimits limits{tokenizer, 512, 2048};
  auto call = kvrt::server::parse_generate(
      std::string_view(reinterpret_cast<const char*>(data), size), limits);
  if (auto* e = std::get_if<kvrt::server::ApiError>(&call)) {
    (void)kvrt::server::error_body(*e);
    return 0;
  }
  const auto& c = std::get<kvrt::server::GenerateCall>(call);
  kvrt::server::GenerateResult r;
  r.output_ids = c.prompts.front();
  r.text = tokenizer->decode(r.output_ids);
  r.finished = true;
  std::string matched;
  (void)kvrt::server::find_stop(r.text, c.stop, &matched);
  (void)kvrt::server::to_text(kvrt::server::generate_json(r));
  return 0;
}
