// A bench workload TOML ([workload] with its length distributions), then the plan kvrt bench
// would run from it: every request's prompt and length.
#include <cstdint>
#include <string>

#include "core/bench/workload.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  kvrt::Result<kvrt::bench::WorkloadSpec> spec =
      kvrt::bench::parse_workload_toml(text, "fuzz.toml");
  if (!spec.ok()) return 0;
  // Plans of at most a few million tokens, so one input does not take the fuzzer's time.
  const uint64_t per = static_cast<uint64_t>(spec->input.largest() + spec->shared_prefix_len);
  if (spec->num_requests * per > (uint64_t{1} << 22)) return 0;
  kvrt::bench::WorkloadPlan plan(*spec, 512);
  kvrt::bench::PlannedRequest next;
  for (const kvrt::bench::PlannedRequest& r : plan.initial()) {
    (void)plan.next_turn(r.conversation, r.turn, &next);
  }
  return 0;
}
