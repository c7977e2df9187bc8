// The serving path's one request/output vocabulary: what a caller submits to the serving core
// (ServingCore::submit, StepLoop::submit) and what it hears back, step by step, until the
// request ends. `kvrt generate`, `kvrt bench` and `kvrt serve` all speak it; the HTTP API's
// bodies (core/api/) are translated into and out of it, nothing else.
//
// A request's life: submit() checks it once (check_request) and refuses it with a Status that
// names the field at fault, or queues it. From then on its sink hears one RequestOutput per step
// that gave it new tokens (its first token at once, then every ServingOptions::stream_interval
// tokens; only the end when it does not stream), and the last one has `finished` set, exactly
// once, whatever ends it:
// its length, a stop token, a stop string (found on the step thread, in the step that completes
// it), an abort (the client went away, /abort_request, a timeout, shutdown) or an engine failure.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/sampling/params.h"

namespace kvrt::serve {

struct GenerateRequest {
  uint64_t id = 0;  // unique among the requests in flight
  std::vector<int32_t> input_ids;
  // 0: no tokens (SGLang's answer to max_new_tokens 0): the prompt is prefilled, and the request
  // ends with kLength and no ids.
  int32_t max_new_tokens = 128;
  sampling::SamplingParams sampling;
  // Generation ends after one of these, and after the model's EOS ids
  // (ServingOptions::eos_token_ids) unless ignore_eos.
  std::vector<int32_t> stop_token_ids;
  // SGLang's sampling_params.ignore_eos, `kvrt generate --ignore-eos`: only stop_token_ids stop.
  bool ignore_eos = false;
  // Generation ends when the decoded output contains one of these; the text is cut before it.
  // Needs the core to have a tokenizer.
  std::vector<std::string> stop;
  // false: the sink hears one output only, at the end, holding every id and the whole text (a
  // caller that answers once saves an output per step).
  bool stream = true;
};

// How a request ended.
enum class FinishReason {
  kLength,        // max_new_tokens, or the model's context, reached
  kStopToken,     // it sampled one of stop_token_ids
  kStopString,    // its text completed one of `stop`
  kAborted,       // ended from outside: client gone, /abort_request, a timeout, shutdown
  kEngineFailure  // the engine failed the step that ran it
};
// "length", "stop_token", "stop_string", "aborted", "engine_failure".
inline const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStopToken:
      return "stop_token";
    case FinishReason::kStopString:
      return "stop_string";
    case FinishReason::kAborted:
      return "aborted";
    case FinishReason::kEngineFailure:
      return "engine_failure";
  }
  return "unknown";
}
// Length and stops: the request ran to its end (counted as finished, not aborted).
inline bool completed(FinishReason reason) {
  return reason == FinishReason::kLength || reason == FinishReason::kStopToken ||
         reason == FinishReason::kStopString;
}

// What one step did for a request.
struct RequestOutput {
  uint64_t id = 0;
  std::vector<int32_t> new_ids;  // the ids sampled since the last output
  // One per new id when the request asked for log-probabilities (sampling.logprobs >= 0; see
  // sampling/sampler.h for which distribution they are of).
  std::vector<sampling::SampledLogprobs> new_logprobs;
  // The prompt's (sampling.prompt_logprobs_from >= 0), for positions max(from, 1) on, in the
  // first output.
  std::vector<sampling::SampledLogprobs> prompt_logprobs;
  // The text since the last output: whole characters only, and never any part of a stop string
  // (text that may be the start of one is held back until it is known not to be), so the
  // streamed pieces add up to the finished answer. Empty without a tokenizer.
  std::string new_text;
  int32_t output_tokens = 0;  // every id so far
  int32_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens served from the prefix cache
  bool finished = false;
  // When finished:
  FinishReason finish_reason = FinishReason::kLength;
  int32_t matched_token = -1;  // kStopToken: the id
  std::string matched_stop;    // kStopString: the string
  std::string message;         // kAborted, kEngineFailure: why
};

// Where a request's outputs go; called on the step thread, each output handed over (moved).
using RequestSink = std::function<void(RequestOutput)>;

}  // namespace kvrt::serve
