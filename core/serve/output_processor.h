// The output processor: each request's state from its submission to its end -- its sampler, the
// ids and log-probabilities it generated, its text and stop strings (detokenizer.h), where its
// outputs go -- and the RequestOutputs that each step's Scheduler::update turns into.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/sampling/sampler.h"
#include "core/text/tokenizer.h"
#include "core/sched/scheduler.h"
#include "core/text/detokenizer.h"
#include "core/serve/request.h"

namespace kvrt::serve {

class OutputProcessor {
 public:
  // `tokenizer` (null: ids only, no text) outlives the processor. A streamed request hears its
  // first token at once, then an output every `stream_interval` tokens, and its end.
  OutputProcessor(const text::Tokenizer* tokenizer, int stream_interval)
      : tokenizer_(tokenizer), stream_interval_(stream_interval) {}

  // A request the scheduler is about to queue.
  void add(const GenerateRequest& request, RequestSink sink);
  bool contains(uint64_t id) const { return live_.count(id) != 0; }
  size_t size() const { return live_.size(); }
  std::vector<uint64_t> ids() const;
  sampling::Sampler& sampler(uint64_t id) { return live_.at(id).sampler; }

  // One generated token: appended, with its log-probabilities, its text decoded. True when the
  // text now completes one of the request's stop strings: the caller ends it (Scheduler::stop).
  bool advance(const sched::Advanced& token);
  // The request ended as the scheduler says; an abort ends with `abort_reason` and `message`.
  void end(const sched::Ended& ended, FinishReason abort_reason = FinishReason::kAborted,
           const std::string& message = {});
  // Hands every request advanced or ended since the last call its output where one is due (a
  // stream's first token, then every stream_interval tokens; every request's end), in the order
  // they advanced. A sink may submit or abort meanwhile.
  void deliver();

 private:
  struct Live {
    Live(RequestSink s, const GenerateRequest& request, text::OutputText t)
        : sink(std::make_shared<const RequestSink>(std::move(s))),
          sampler(request.sampling, request.input_ids, request.stop_token_ids),
          text(std::move(t)) {}
    // Shared, so a sink that submits or aborts (and rehashes live_) is not moved under itself.
    std::shared_ptr<const RequestSink> sink;
    sampling::Sampler sampler;
    text::OutputText text;
    std::vector<int32_t> output;                  // every id sampled
    std::vector<sampling::SampledLogprobs> logprobs;  // not yet in an output (sampling.logprobs)
    size_t sent_ids = 0;                          // of output, in an earlier output
    bool stream = true;                           // GenerateRequest::stream
    bool no_output = false;                       // max_new_tokens 0: the prefill's token is dropped
    bool stop_string = false;                     // its text completed a stop string
    int32_t prompt_tokens = 0;
    int64_t cached_tokens = 0;
    bool advanced = false;             // in advanced_ already
    std::optional<RequestOutput> end;  // its last output, once it ended
  };
  void mark(uint64_t id, Live& live);
  void deliver(uint64_t id);

  const text::Tokenizer* tokenizer_;
  int stream_interval_;
  std::unordered_map<uint64_t, Live> live_;
  std::vector<uint64_t> advanced_;  // advanced or ended since the last deliver(), in order
};

}  // namespace kvrt::serve
