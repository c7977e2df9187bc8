// A JSONL trace (one {"timestamp", "input_len", "output_len", "group", "prefix_len"} per line),
// then the plan kvrt bench would run from it.
#include <cstdint>
#include <string>

#include "core/bench/workload.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  kvrt::Result<kvrt::bench::WorkloadSpec> spec =
      kvrt::bench::parse_trace_jsonl(text, "fuzz.jsonl");
  if (!spec.ok()) return 0;
  uint64_t tokens = 0;
  for (const kvrt::bench::TraceEntry& e : spec->trace) tokens += e.input_len + e.prefix_len;
  if (tokens > (uint64_t{1} << 22)) return 0;
  kvrt::bench::WorkloadPlan plan(*spec, 512);
  return 0;
}
