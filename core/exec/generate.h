// One sequence straight through the engine, without the scheduler: chunked prefill of the
// prompt, then decode steps until max_new_tokens or a stop token, on pages taken in order from
// the start of the pool. The reference that engine tests and benchmarks measure against;
// `kvrt generate` goes through the serving core (core/serve) like every other request.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "core/exec/engine.h"
#include "core/sampling/sampler.h"

namespace kvrt::exec {

struct GenerateOptions {
  int32_t max_new_tokens = 64;
  sampling::SamplingParams sampling;
  std::vector<int32_t> stop_ids;  // generation ends after emitting one of these
  int64_t prefill_chunk = 2048;   // tokens per prefill step; <= 0: the whole prompt at once
};

struct Generation {
  std::vector<int32_t> ids;         // generated, excluding the prompt
  std::vector<float> first_logits;  // logits that chose ids[0]
  std::string stop_reason;          // "length" or "stop"
  double prefill_seconds = 0, decode_seconds = 0;
};

// A request longer than the pool (prompt + max_new_tokens tokens) is refused up front, naming
// both sizes.
Result<Generation> generate(Engine& engine, std::span<const int32_t> prompt,
                                const GenerateOptions& options);

}  // namespace kvrt::exec
