#include "core/serve/output_processor.h"

#include <algorithm>

namespace kvrt::serve {

void OutputProcessor::add(const GenerateRequest& request, RequestSink sink) {
  Live live(std::move(sink), request,
            text::OutputText(tokenizer_, request.input_ids, request.stop));
  live.prompt_tokens = static_cast<int32_t>(request.input_ids.size());
  live.stream = request.stream;
  live.no_output = request.max_new_tokens == 0;
  live_.emplace(request.id, std::move(live));
}

std::vector<uint64_t> OutputProcessor::ids() const {
  std::vector<uint64_t> ids;
  ids.reserve(live_.size());
  for (const auto& entry : live_) ids.push_back(entry.first);
  return ids;
}

void OutputProcessor::mark(uint64_t id, Live& live) {
  if (live.advanced) return;
  live.advanced = true;
  advanced_.push_back(id);
}

bool OutputProcessor::advance(const sched::Advanced& token) {
  Live& live = live_.at(token.id);
  live.cached_tokens = token.cached_tokens;
  mark(token.id, live);
  if (live.no_output) {
    if (live.sampler.has_logprobs()) live.sampler.take_logprobs();
    return false;
  }
  live.output.push_back(token.token);
  // Each sampled token was the sampler's; a runner that samples elsewhere (a test's) has none.
  if (live.sampler.has_logprobs()) live.logprobs.push_back(live.sampler.take_logprobs());
  // A completed stop string ends the request with this token, counted as finished.
  live.stop_string = tokenizer_ != nullptr && live.text.update(live.output);
  return live.stop_string;
}

void OutputProcessor::end(const sched::Ended& ended, FinishReason abort_reason,
                          const std::string& message) {
  Live& live = live_.at(ended.id);
  RequestOutput end;
  end.finished = true;
  if (ended.kind == sched::FinishKind::kAborted) {
    end.finish_reason = abort_reason;
    end.message = message;
  } else if (live.no_output) {
    // (Its dropped token may have been a stop id: it asked for no tokens and got as many.)
    end.finish_reason = FinishReason::kLength;
  } else if (live.stop_string) {
    end.finish_reason = FinishReason::kStopString;
    end.matched_stop = live.text.matched();
  } else if (ended.kind == sched::FinishKind::kLength) {
    end.finish_reason = FinishReason::kLength;
  } else {
    end.finish_reason = FinishReason::kStopToken;
    end.matched_token = live.output.empty() ? -1 : live.output.back();
  }
  // The whole output decoded at once: exact, a character the last token left unfinished
  // included (a stop string's cut stays).
  live.text.finish(live.output);
  live.cached_tokens = ended.cached_tokens;
  live.end = std::move(end);
  mark(ended.id, live);
}

void OutputProcessor::deliver() {
  std::vector<uint64_t> due;
  due.swap(advanced_);
  for (uint64_t id : due) deliver(id);
}

void OutputProcessor::deliver(uint64_t id) {
  auto it = live_.find(id);
  if (it == live_.end()) return;
  Live& live = it->second;
  live.advanced = false;
  if (!live.end) {
    // Not ended: due when it streams and this is its first token or an interval's worth.
    const size_t unsent = live.output.size() - live.sent_ids;
    const auto interval = static_cast<size_t>(std::max(1, stream_interval_));
    const bool due = live.stream && unsent > 0 && (live.sent_ids == 0 || unsent >= interval);
    if (!due) return;
  }
  RequestOutput out = live.end ? std::move(*live.end) : RequestOutput{};
  out.id = id;
  out.new_ids.assign(live.output.begin() + static_cast<ptrdiff_t>(live.sent_ids),
                     live.output.end());
  live.sent_ids = live.output.size();
  out.new_logprobs = std::move(live.logprobs);
  live.logprobs.clear();
  out.prompt_logprobs = live.sampler.take_prompt_logprobs();
  if (tokenizer_ != nullptr) out.new_text = live.text.take();
  out.output_tokens = static_cast<int32_t>(live.output.size());
  out.prompt_tokens = live.prompt_tokens;
  out.cached_tokens = live.cached_tokens;
  const std::shared_ptr<const RequestSink> sink = live.sink;
  // Ended: forgotten before its sink hears it, so a sink may submit the next request at once.
  if (out.finished) live_.erase(it);
  if (*sink) (*sink)(std::move(out));
}

}  // namespace kvrt::serve
