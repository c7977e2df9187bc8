// One generating call of kvrt serve's API, apart from any socket: its prompts tokenized, fanned
// out into prompts x n (or best_of) serve::GenerateRequests submitted to the step loop, their
// outputs gathered into GenerateResults, and the answer returned as a Reply for the transport
// to write -- whole, or as the stream's events (first, middle, last, then [DONE]). The
// transport (core/http) calls the Call and writes what it returns; the Call never calls the
// transport. A test drives it the same way.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/api/generate.h"
#include "core/api/protocol.h"
#include "core/serve/request.h"

namespace kvrt::api {

// What the API gives the transport to write, in order: a whole answer, or a stream's head, its
// events and its end. Either the answer or the end ends the exchange; an empty Reply writes
// nothing (the call goes on).
struct Reply {
  struct Answer {
    int status = 200;
    std::string body;
    const char* content_type = "application/json";
    bool retry_after = false;  // "Retry-After: 1": a full queue, the client may retry
  };
  std::optional<Answer> answer;     // the whole answer
  bool begin_stream = false;        // the stream's head (200, text/event-stream), first
  std::vector<std::string> events;  // the stream's events, each as written, in order
  bool end_stream = false;          // the stream's end, last
  bool ends() const { return answer.has_value() || end_stream; }
};

// A whole answer of `content_type`, one of JSON (application/json), and a refusal in the API's
// error shape (a 503 server_overloaded with Retry-After).
Reply text_reply(int status, std::string body, const char* content_type);
Reply json_reply(int status, std::string body);
Reply error_reply(const ApiError& error);

// How the transport runs a call's work on its connection: `task` runs there, one at a time with
// the connection's other work, and the Reply it returns is written. The step loop's sinks post
// through it from the step thread; it keeps the connection alive until the task has run.
using Post = std::function<void(std::function<Reply()> task)>;

class Service;

class Call : public std::enable_shared_from_this<Call> {
 public:
  // `health`: GET /health_generate's one-token call, answered 200 with no body, or 503.
  // `post` runs the call's outputs on its connection (the sinks' way back).
  Call(Service& service, GenerateCall call, Post post, bool health = false);

  // The call's steps after parsing: tokenize its prompts, draw its seed when unseeded, submit
  // each prompt's first candidate (the others once it has a token). Returns the stream's head
  // for a stream, nothing for a whole answer (it comes when the requests end), or the refusal
  // (Reply::ends(): nothing runs).
  Reply start();
  // Ends every request of the call not yet ended with `reason` (the client went away, the
  // server shuts down, request_timeout_s passed); each is answered as aborted.
  Reply abort(const std::string& reason);
  // Requests still running (0 once the call is answered).
  size_t unfinished() const { return unfinished_; }
  // One output of request k (pending_[k]), on the connection: what to write for it.
  Reply on_output(size_t k, const serve::RequestOutput& out);

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

  // Each writes into reply_ what its step has to say (on_output, abort and start return it).
  void output(size_t k, const serve::RequestOutput& out);
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
  void write_event(std::string event) { reply_.events.push_back(std::move(event)); }
  // The answer is out: the call no longer holds its connection (the connection holds the call
  // while it runs, so keeping post_ would keep both alive; the sinks still in the step loop
  // keep their own copies until it drops them).
  void release() { post_ = nullptr; }
  // What was written since the last take.
  Reply take() { return std::exchange(reply_, Reply{}); }

  Service& service_;
  GenerateCall call_;
  Post post_;
  Reply reply_;  // what the call's work has written, until the transport takes it
  bool health_ = false;
  bool answered_ = false;  // the call's answer went out (or began to)
  int64_t sequence_ = 0;  // a Responses stream's next sequence_number
  std::vector<Pending> pending_;
  size_t unfinished_ = 0;
  Clock::time_point started_;
  int64_t created_ = 0;  // OpenAI's "created", Unix seconds
};

// Unix time in seconds (OpenAI's "created").
int64_t unix_time();

}  // namespace kvrt::api
