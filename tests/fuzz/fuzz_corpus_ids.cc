// kvrt eval --ids: a corpus of token ids, against a vocabulary of 512.
#include <cstdint>
#include <string_view>

#include "core/eval/corpus.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)kvrt::eval::parse_token_ids(text, "fuzz.ids", 512);
  return 0;
}
