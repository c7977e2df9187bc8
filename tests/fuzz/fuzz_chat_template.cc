// A model directory's chat template (kvrt serve): parsed by the Jinja subset, and when it
// parses, rendered over a small conversation. Either may refuse; neither may crash or hang.
#include <cstdint>
#include <string_view>

#include "core/server/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  kvrt::Result<kvrt::server::ChatTemplate> t = kvrt::server::ChatTemplate::parse(source);
  if (!t.ok()) return 0;
  (void)t->render({{"system", "s"}, {"user", "u"}, {"assistant", "a"}, {"user", "v"}}, "<s>",
                  "</s>");
  return 0;
}
