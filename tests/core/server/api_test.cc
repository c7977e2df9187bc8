// The API's pure functions apart from any server: generate_event, the streamed /generate event
// built from what earlier events already escaped, is exactly to_text(generate_json(...)) at
// every step of a stream -- ASCII, quotes, control characters, multibyte characters, bytes that
// are not UTF-8 (replaced by U+FFFD as a whole dump replaces them), log-probabilities, the end.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/server/api.h"

namespace kvrt::server {
namespace {

TEST(GenerateEvent, EqualsTheWholeDumpAtEveryStep) {
  for (int logprobs : {-1, 2}) {
    GenerateCall call;
    call.sampling.logprobs = logprobs;
    GenerateResult r;
    r.rid = "r-1";
    r.prompt_tokens = 4;
    GenerateEventCache cache;
    const std::vector<std::string> pieces = {"Once",  " \"upon\"", "\\ a\n\ttime", "",
                                             "\x01 é", "日本",     "\xff\xfe",     " end"};
    int32_t id = 3;
    for (size_t i = 0; i < pieces.size(); ++i) {
      serve::RequestOutput out;
      out.new_ids = {id, id + 1};
      out.new_text = pieces[i];
      if (logprobs >= 0) {
        for (int32_t k : out.new_ids) out.new_logprobs.push_back({{k, -0.25f}, {{k, -0.25f}}});
      }
      id += 2;
      out.prompt_tokens = 4;
      out.finished = i + 1 == pieces.size();
      r.add(out);
      EXPECT_EQ(generate_event(call, r, &cache), to_text(generate_json(call, r))) << "step " << i;
    }
  }
}

}  // namespace
}  // namespace kvrt::server
