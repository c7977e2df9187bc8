// One generating call of kvrt serve's API, apart from any socket: its prompts tokenized, fanned
// out into prompts x n (or best_of) serve::GenerateRequests submitted to the step loop, their
// outputs gathered into GenerateResults, and the answer written through an Exchange -- whole, or
// as the stream's events (first, middle, last, then [DONE]). The transport (core/http) drives it
// and implements Exchange; a test can drive it with an Exchange of its own.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/api/generate.h"
#include "core/api/protocol.h"
#include "core/serve/request.h"

namespace kvrt::api {

// What the API layer needs of the connection a request came on. Every method is called on the
// connection's strand (one at a time), and the transport calls the Call's there too.
class Exchange {
 public:
  virtual ~Exchange() = default;
  // The whole answer: its status, body and content type; `retry_after` adds "Retry-After: 1"
  // (a full queue: the client may retry). Ends the exchange.
  virtual void respond(int status, std::string body, const char* content_type,
                       bool retry_after) = 0;
  // A stream: its head (200, text/event-stream), its events (each written as it comes, in
  // order), then its end, which ends the exchange.
  virtual void begin_stream() = 0;
  virtual void write_event(const std::string& data) = 0;
  virtual void end_stream() = 0;
  // Runs `task` on the connection's strand, keeping the connection alive until it has run (the
  // step loop's sinks call it from the step thread).
  virtual void post(std::function<void()> task) = 0;
};

// An answer of JSON (application/json), and a refusal in the API's error shape (a 503
// server_overloaded with Retry-After).
void respond_json(Exchange& exchange, int status, std::string body);
void respond_error(Exchange& exchange, const ApiError& error);

class Service;

class Call : public std::enable_shared_from_this<Call> {
 public:
  // `health`: GET /health_generate's one-token call, answered 200 with no body, or 503.
  Call(Service& service, GenerateCall call, std::shared_ptr<Exchange> exchange,
       bool health = false);

  // The call's steps after parsing: tokenize its prompts, draw its seed when unseeded, submit
  // each prompt's first candidate (the others once it has a token) and, for a stream, write the
  // stream's head. False when it was refused (its refusal is answered, and nothing runs).
  bool start();
  // Ends every request of the call not yet ended with `reason` (the client went away, the
  // server shuts down, request_timeout_s passed); each is answered as aborted.
  void abort(const std::string& reason);
  // Requests still running (0 once the call is answered).
  size_t unfinished() const { return unfinished_; }
  // One output of request k (pending_[k]), on the connection's strand.
  void on_output(size_t k, const serve::RequestOutput& out);

 private:
  using Clock = std::chrono::steady_clock;
  // One request of the call: candidate `candidate` of prompt `prompt` (a prompt has n
  // candidates, or best_of when more). pending_[prompt * candidates + candidate].
  struct Pending {
    uint64_t id = 0;
    size_t prompt = 0;
    size_t candidate = 0;
    bool submitted = false;
    GenerateResult result;
    size_t sent_text = 0;  // streaming: text already sent
    size_t sent_ids = 0;
    size_t sent_logprobs = 0;  // of result.logprobs
    GenerateEventCache event_cache;  // /generate streams: the ids and text sent so far, as JSON
  };

  void refuse(const ApiError& e);
  std::string openai_id() const;
  std::string message_id() const;
  void begin_responses_stream();
  void end_responses_stream(const Pending& p);
  sampling::SamplingParams sampling_of(const Pending& p) const;
  size_t candidates() const;
  std::pair<serve::GenerateRequest, serve::RequestSink> request_for(size_t k);
  void submit_rest(size_t prompt);
  void answer(Pending& last);
  std::vector<GenerateResult> shown_results() const;
  void stream_chunk(Pending& p);
  // The exchange is over: nothing more is written, and the connection is no longer held.
  void finish();

  Service& service_;
  GenerateCall call_;
  std::shared_ptr<Exchange> exchange_;  // null once answered
  bool health_ = false;
  std::vector<int32_t> stop_ids_;  // the call's stop ids and, unless ignore_eos, the model's EOS
  bool answered_ = false;          // the call's answer went out (or began to)
  int64_t sequence_ = 0;           // a Responses stream's next sequence_number
  std::vector<Pending> pending_;
  size_t unfinished_ = 0;
  Clock::time_point started_;
  int64_t created_ = 0;  // OpenAI's "created", Unix seconds
};

// Unix time in seconds (OpenAI's "created").
int64_t unix_time();

}  // namespace kvrt::api
