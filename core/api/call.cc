#include "core/api/call.h"

#include <algorithm>
#include <random>
#include <span>
#include <utility>

#include "core/api/openai.h"
#include "core/api/prompt.h"
#include "core/api/responses.h"
#include "core/api/service.h"
#include "core/text/utf8.h"
#include "core/util/text.h"

namespace kvrt::api {

using nlohmann::json;

namespace {

uint64_t fresh_seed() {
  thread_local std::random_device entropy;
  return (static_cast<uint64_t>(entropy()) << 32) ^ entropy();
}

}  // namespace

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Reply text_reply(int status, std::string body, const char* content_type) {
  Reply r;
  r.answer = Reply::Answer{status, std::move(body), content_type, /*retry_after=*/false};
  return r;
}

Reply json_reply(int status, std::string body) {
  return text_reply(status, std::move(body), "application/json");
}

Reply error_reply(const ApiError& e) {
  Reply r = json_reply(e.status, error_body(e));
  // "Full now": the client may retry; nothing else is worth a retry.
  r.answer->retry_after = e.type == "server_overloaded";
  return r;
}

Call::Call(Service& service, GenerateCall call, Post post, bool health)
    : service_(service), call_(std::move(call)), post_(std::move(post)), health_(health) {}

void Call::refuse(const ApiError& e) {
  pending_.clear();
  answered_ = true;
  release();
  reply_ =
      health_ ? json_reply(503, error_body({503, e.message, "", "server_error"})) : error_reply(e);
}

// One id for the call, its choices told apart by index (as OpenAI's).
std::string Call::openai_id() const {
  const char* prefix = call_.dialect == Dialect::kChat        ? "chatcmpl-"
                       : call_.dialect == Dialect::kResponses ? "resp_"
                                                              : "cmpl-";
  return prefix + pending_[0].result.rid;
}

// The Responses API's message id, beside the response's ("resp_<rid>", "msg_<rid>").
std::string Call::message_id() const { return "msg_" + pending_[0].result.rid; }

Reply Call::start() {
  // The prompt step: text and conversations to ids (a refusal names the call's field).
  if (auto e = tokenize_prompts(&call_, service_.limits())) {
    refuse(*e);
    return take();
  }
  // Unseeded: a fresh seed per call (recorded in the trace), so that two unseeded requests
  // are two draws, as in SGLang and vLLM, yet each can be replayed exactly.
  if (!call_.seeded) call_.sampling.seed = fresh_seed();
  created_ = unix_time();
  pending_.clear();
  const size_t per = candidates();
  pending_.resize(call_.prompts.size() * per);
  started_ = Clock::now();
  for (size_t k = 0; k < pending_.size(); ++k) {
    Pending& p = pending_[k];
    p.prompt = k / per;
    p.candidate = k % per;
    p.id = service_.loop().next_id();
    const std::string& rid = call_.rids[p.prompt];
    p.result.rid = rid.empty() ? std::to_string(pending_[k - p.candidate].id) : rid;
    p.result.prompt_tokens = static_cast<int32_t>(call_.prompts[p.prompt].size());
    p.result.keep_stop = call_.no_stop_trim;
    const std::vector<int32_t>& ids = call_.prompts[p.prompt];
    if (!ids.empty()) p.result.first_prompt_token = ids[0];
  }
  // A prompt's first candidate goes now; its others once it has a token (its prefill done and
  // its pages in the prefix cache, which they then share: one prefill, n decodes).
  std::vector<std::pair<serve::GenerateRequest, serve::RequestSink>> batch;
  for (size_t i = 0; i < call_.prompts.size(); ++i) batch.push_back(request_for(i * per));
  size_t refused = 0;
  if (Status s = service_.loop().submit(std::move(batch), &refused); !s.ok()) {
    // Nothing of the call was submitted.
    pending_.clear();
    refuse(refusal(s, call_, refused));
    return take();
  }
  for (size_t i = 0; i < call_.prompts.size(); ++i) {
    pending_[i * per].submitted = true;
    service_.remember_rid(pending_[i * per].result.rid, pending_[i * per].id);
  }
  answered_ = false;
  unfinished_ = pending_.size();
  if (call_.stream) {
    reply_.begin_stream = true;
    if (call_.dialect == Dialect::kResponses) begin_responses_stream();
  }
  return take();
}

// The response and its one message open before any text.
void Call::begin_responses_stream() {
  sequence_ = 0;
  const json response = responses_json(call_, pending_[0].result, openai_id(), created_);
  write_event(
      sse_event(responses_event("response.created", sequence_++, {{"response", response}})));
  write_event(
      sse_event(responses_event("response.in_progress", sequence_++, {{"response", response}})));
  write_event(sse_event(responses_event("response.output_item.added", sequence_++,
                                        {{"output_index", 0},
                                         {"item",
                                          {{"type", "message"},
                                           {"id", message_id()},
                                           {"status", "in_progress"},
                                           {"role", "assistant"},
                                           {"content", json::array()}}}})));
  write_event(sse_event(responses_event(
      "response.content_part.added", sequence_++,
      {{"item_id", message_id()},
       {"output_index", 0},
       {"content_index", 0},
       {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}})));
}

// The Responses stream's end: the text done, the part and the message closed, then the
// response completed (incomplete at max_output_tokens; failed when aborted).
void Call::end_responses_stream(const Pending& p) {
  const json response = responses_json(call_, p.result, openai_id(), created_);
  if (!serve::completed(p.result.reason)) {
    json failed = response;
    failed["status"] = "failed";
    failed["error"] = {{"code", p.result.reason == serve::FinishReason::kEngineFailure
                                    ? "server_error"
                                    : "request_aborted"},
                       {"message", p.result.message}};
    write_event(sse_event(responses_event("response.failed", sequence_++, {{"response", failed}})));
    return;
  }
  const json part = {{"type", "output_text"}, {"text", p.result.text},
                     {"annotations", json::array()}};
  write_event(sse_event(responses_event("response.output_text.done", sequence_++,
                                        {{"item_id", message_id()},
                                         {"output_index", 0},
                                         {"content_index", 0},
                                         {"text", p.result.text},
                                         {"logprobs", json::array()}})));
  write_event(sse_event(responses_event(
      "response.content_part.done", sequence_++,
      {{"item_id", message_id()}, {"output_index", 0}, {"content_index", 0}, {"part", part}})));
  write_event(sse_event(responses_event("response.output_item.done", sequence_++,
                                        {{"output_index", 0}, {"item", response["output"][0]}})));
  write_event(sse_event(responses_event(
      response["status"] == "completed" ? "response.completed" : "response.incomplete", sequence_++,
      {{"response", response}})));
}

// The sampling of pending_[k]'s request: the call's, its seed its choice's own.
sampling::SamplingParams Call::sampling_of(const Pending& p) const {
  sampling::SamplingParams sampling = call_.sampling;
  sampling.seed = choice_seed(call_.sampling.seed, p.candidate);
  return sampling;
}

// Requests per prompt: n, or best_of when it asks for more (the n best are answered).
size_t Call::candidates() const {
  return static_cast<size_t>(std::max({call_.n, call_.best_of, int32_t{1}}));
}

// The request of pending_[k], with the sink that brings its outputs back to the call.
std::pair<serve::GenerateRequest, serve::RequestSink> Call::request_for(size_t k) {
  const Pending& p = pending_[k];
  serve::GenerateRequest r;
  r.id = p.id;
  r.input_ids = call_.prompts[p.prompt];
  r.max_new_tokens = call_.max_new_tokens;
  // Each candidate its own seed stream; best_of ranks by the candidates' log-probabilities.
  r.sampling = sampling_of(p);
  if (call_.best_of > call_.n) r.sampling.logprobs = std::max(r.sampling.logprobs, 0);
  r.stop_token_ids = call_.stop_token_ids;
  r.ignore_eos = call_.ignore_eos;
  r.stop = call_.stop;
  // A first candidate with others to follow streams, so its first token is heard.
  r.stream = call_.stream || (p.candidate == 0 && candidates() > 1);
  // The sinks keep the call and its connection alive until the request ends (the core drops
  // them then), so its answer always has a connection to go to.
  serve::RequestSink sink = [self = shared_from_this(), post = post_, k](serve::RequestOutput out) {
    post([self, k, out = std::move(out)] { return self->on_output(k, out); });
  };
  return {std::move(r), std::move(sink)};
}

// The other candidates of `prompt`, once its first has a token; when it ended without one
// (aborted, failed) they end as it did.
void Call::submit_rest(size_t prompt) {
  const size_t per = candidates();
  const GenerateResult& first = pending_[prompt * per].result;
  std::vector<std::pair<serve::GenerateRequest, serve::RequestSink>> batch;
  for (size_t k = prompt * per + 1; k < (prompt + 1) * per; ++k) {
    if (!pending_[k].submitted && !pending_[k].result.finished) batch.push_back(request_for(k));
  }
  if (batch.empty()) return;
  Status s;
  if (first.finished && !serve::completed(first.reason)) {
    s = Status::Internal(first.message);
  } else {
    size_t refused = 0;
    s = service_.loop().submit(std::move(batch), &refused);
  }
  for (size_t k = prompt * per + 1; k < (prompt + 1) * per; ++k) {
    Pending& p = pending_[k];
    if (p.submitted || p.result.finished) continue;
    if (s.ok()) {
      p.submitted = true;
      service_.remember_rid(p.result.rid, p.id);
      continue;
    }
    serve::RequestOutput end;
    end.id = p.id;
    end.finished = true;
    end.finish_reason = first.finished && !serve::completed(first.reason)
                            ? first.reason
                            : serve::FinishReason::kAborted;
    end.message = s.message();
    output(k, end);
  }
}

Reply Call::abort(const std::string& reason) {
  for (size_t k = 0; k < pending_.size(); ++k) {
    const Pending& p = pending_[k];
    if (p.result.finished) continue;
    if (p.submitted) {
      service_.loop().abort(p.id, reason);
    } else {
      // Never submitted (a candidate waiting for its prompt's first): it ends here.
      serve::RequestOutput end;
      end.id = p.id;
      end.finished = true;
      end.finish_reason = serve::FinishReason::kAborted;
      end.message = reason;
      output(k, end);
    }
  }
  return take();
}

Reply Call::on_output(size_t k, const serve::RequestOutput& out) {
  output(k, out);
  return take();
}

void Call::output(size_t k, const serve::RequestOutput& out) {
  if (k >= pending_.size() || pending_[k].id != out.id) return;
  Pending& p = pending_[k];
  if (p.result.finished) return;
  const bool first_output = p.result.output_ids.empty() && !p.result.finished;
  p.result.add(out);
  if (out.finished) {
    p.result.e2e_latency = std::chrono::duration<double>(Clock::now() - started_).count();
    service_.record(started_, p.result, sampling_of(p));
    --unfinished_;
  }
  if (call_.stream && unfinished_ > 0) stream_chunk(p);
  if (first_output && p.candidate == 0 && candidates() > 1) submit_rest(p.prompt);
  if (out.finished && unfinished_ == 0) answer(p);
}

// Every request of the call has ended (`last` the last to): the answer.
void Call::answer(Pending& last) {
  if (answered_) return;
  answered_ = true;
  release();
  for (const Pending& p : pending_) service_.forget_rid(p.result.rid, p.id);
  // A whole answer is all the reply holds (nothing of a stream was written).
  if (health_) {
    reply_ = serve::completed(last.result.reason)
                 ? text_reply(200, "", "text/plain")
                 : json_reply(503, error_body({503, last.result.message, "", "server_error"}));
    return;
  }
  if (call_.stream && call_.dialect == Dialect::kResponses) {
    stream_chunk(last);
    end_responses_stream(last);
    reply_.end_stream = true;
    return;
  }
  if (call_.stream) {
    stream_chunk(last);
    if (call_.include_usage) {
      write_event(
          "data: " + to_text(openai_usage_chunk(call_, shown_results(), openai_id(), created_)) +
          "\n\n");
    }
    write_event("data: [DONE]\n\n");
    reply_.end_stream = true;
    return;
  }
  const bool openai = call_.dialect != Dialect::kGenerate;
  for (const Pending& q : pending_) {
    // An engine failure is a 500 in every API; an abort is an error only in OpenAI's, whose
    // finish reasons are "stop" and "length" (SGLang's /generate answers finish_reason abort).
    if (q.result.reason == serve::FinishReason::kEngineFailure ||
        (openai && !serve::completed(q.result.reason))) {
      reply_ = error_reply(openai_abort_error(q.result));
      return;
    }
  }
  std::vector<GenerateResult> results = shown_results();
  if (call_.dialect == Dialect::kResponses) {
    reply_ = json_reply(200, to_text(responses_json(call_, results[0], openai_id(), created_)));
  } else if (openai) {
    reply_ = json_reply(200, to_text(openai_json(call_, results, openai_id(), created_)));
  } else {
    json body;
    if (call_.batch || candidates() > 1) {
      body = json::array();
      for (const GenerateResult& r : results) body.push_back(generate_json(call_, r));
    } else {
      body = generate_json(call_, results[0]);
    }
    reply_ = json_reply(200, to_text(body));
  }
}

// The answered results in choice order (prompt by prompt, n each): with best_of > n, the n of
// each prompt's candidates with the highest cumulative log-probability.
std::vector<GenerateResult> Call::shown_results() const {
  const size_t per = candidates();
  const auto n = static_cast<size_t>(std::max(call_.n, int32_t{1}));
  std::vector<GenerateResult> shown;
  for (size_t i = 0; i * per < pending_.size(); ++i) {
    std::vector<const GenerateResult*> group;
    for (size_t k = i * per; k < (i + 1) * per; ++k) group.push_back(&pending_[k].result);
    if (per > n) {
      auto total = [](const GenerateResult* r) {
        double sum = 0;
        for (const sampling::SampledLogprobs& e : r->logprobs) sum += e.chosen.logprob;
        return sum;
      };
      std::stable_sort(group.begin(), group.end(), [&](const GenerateResult* a,
                                                       const GenerateResult* b) {
        return total(a) > total(b);
      });
    }
    for (size_t j = 0; j < n && j < group.size(); ++j) {
      shown.push_back(*group[j]);
      shown.back().counts_prompt = j == 0;  // usage counts a prompt once, as OpenAI's
    }
  }
  return shown;
}

// One server-sent event: SGLang's with the text and the output ids so far (the new ones
// alone with incremental_streaming_output), OpenAI's with the text since the last chunk (or,
// for an aborted request, OpenAI's error object).
void Call::stream_chunk(Pending& p) {
  if (call_.dialect == Dialect::kGenerate) {
    const bool incremental = service_.options().incremental_streaming_output;
    const std::string event =
        incremental ? to_text(generate_json(call_, p.result, p.sent_ids, p.sent_text))
                    : generate_event(call_, p.result, &p.event_cache);
    p.sent_ids = p.result.output_ids.size();
    p.sent_text = p.result.text.size();
    return write_event("data: " + event + "\n\n");
  }
  if (call_.dialect == Dialect::kResponses) {
    const std::string delta =
        p.result.text.substr(std::min(p.sent_text, p.result.text.size()));
    p.sent_text = p.result.text.size();
    if (delta.empty()) return;
    return write_event(sse_event(responses_event("response.output_text.delta", sequence_++,
                                                 {{"item_id", message_id()},
                                                  {"output_index", 0},
                                                  {"content_index", 0},
                                                  {"delta", delta},
                                                  {"logprobs", json::array()}})));
  }
  if (p.result.finished && !serve::completed(p.result.reason)) {
    return write_event("data: " + error_body(openai_abort_error(p.result)) + "\n\n");
  }
  const std::string delta = p.result.text.substr(std::min(p.sent_text, p.result.text.size()));
  if (delta.empty() && !p.result.finished) return;  // its ids' log-probabilities wait too
  // completions' text_offset: from the characters sent before this chunk.
  const size_t offset = text::utf8_characters(std::string_view(p.result.text).substr(
      0, std::min(p.sent_text, p.result.text.size())));
  p.sent_text = p.result.text.size();
  const std::span<const sampling::SampledLogprobs> logprobs =
      std::span<const sampling::SampledLogprobs>(p.result.logprobs)
          .subspan(std::min(p.sent_logprobs, p.result.logprobs.size()));
  p.sent_logprobs = p.result.logprobs.size();
  const size_t index = p.prompt * static_cast<size_t>(std::max(call_.n, int32_t{1})) +
                       p.candidate;  // the choice's index, as OpenAI orders them
  write_event("data: " +
              to_text(openai_chunk(call_, p.result, delta, openai_id(), created_, index, logprobs,
                                   offset)) +
              "\n\n");
}

}  // namespace kvrt::api
