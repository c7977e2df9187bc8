// A model directory's chat template (kvrt serve): parsed, and when it parses, rendered over a
// small conversation with and without the generation prompt. Either may refuse; neither may
// crash, hang or exhaust memory (the renderer's bounds turn runaway templates into errors).
#include <cstdint>
#include <string_view>

#include "core/text/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  kvrt::Result<kvrt::text::ChatTemplate> t = kvrt::text::ChatTemplate::parse(source);
  if (!t.ok()) return 0;
  kvrt::text::RenderOptions options;
  options.bos_token = "<s>";
  options.eos_token = "</s>";
  options.now_unix_seconds = 0;
  for (bool generation_prompt : {true, false}) {
    options.add_generation_prompt = generation_prompt;
    (void)t->render({{"system", "s"},
                     {"user", "u \xC3\xA9"},
                     {"assistant", "<think>\nr\n</think>\n\na"},
                     {"user", "v"}},
                    options);
  }
  return 0;
}
