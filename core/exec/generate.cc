#include "core/exec/generate.h"

#include <algorithm>
#include <chrono>
#include <numeric>

namespace kvrt::exec {

Result<Generation> generate(Engine& engine, std::span<const int32_t> prompt,
                                const GenerateOptions& options) {
  if (prompt.empty()) return Status::InvalidArgument("the prompt is empty");
  const int64_t total = static_cast<int64_t>(prompt.size()) + options.max_new_tokens;
  const int64_t pages_needed = (total + engine.page_size() - 1) / engine.page_size();
  if (pages_needed > static_cast<int64_t>(engine.num_pages())) {
    return Status::OutOfRange("the request needs " + std::to_string(total) + " tokens (" +
                              std::to_string(pages_needed) + " pages) but the KV pool holds " +
                              std::to_string(engine.num_pages() * engine.page_size()) +
                              " tokens (" + std::to_string(engine.num_pages()) + " pages)");
  }
  SequenceStep seq;
  seq.pages.resize(pages_needed);
  std::iota(seq.pages.begin(), seq.pages.end(), 0);
  const int64_t vocab = engine.config().vocab_size;
  sampling::Sampler sampler(options.sampling);
  Generation result;
  using Clock = std::chrono::steady_clock;
  auto seconds_since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };

  // Prefill in chunks; the last chunk's logits pick the first token.
  const int64_t chunk =
      options.prefill_chunk > 0 ? options.prefill_chunk : static_cast<int64_t>(prompt.size());
  auto start = Clock::now();
  std::vector<float> logits;
  for (int64_t at = 0; at < static_cast<int64_t>(prompt.size()); at += chunk) {
    const int64_t n = std::min<int64_t>(chunk, static_cast<int64_t>(prompt.size()) - at);
    seq.start = static_cast<int32_t>(at);
    seq.tokens.assign(prompt.begin() + at, prompt.begin() + at + n);
    Result<std::vector<float>> step = engine.step(Batch{{seq}});
    if (!step.ok()) return step.status();
    logits = std::move(*step);
  }
  result.prefill_seconds = seconds_since(start);
  result.first_logits = logits;

  start = Clock::now();
  seq.start = static_cast<int32_t>(prompt.size());
  result.stop_reason = "length";
  for (int32_t i = 0; i < options.max_new_tokens; ++i) {
    const int32_t next = sampler.sample(std::span<const float>(logits.data(), vocab));
    result.ids.push_back(next);
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), next) !=
        options.stop_ids.end()) {
      result.stop_reason = "stop";
      break;
    }
    if (i + 1 == options.max_new_tokens) break;
    seq.tokens.assign(1, next);
    Result<std::vector<float>> step = engine.step(Batch{{seq}});
    if (!step.ok()) return step.status();
    logits = std::move(*step);
    ++seq.start;
  }
  result.decode_seconds = seconds_since(start);
  return result;
}

}  // namespace kvrt::exec
