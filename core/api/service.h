// kvrt serve's API as a table of routes (method, path, handler), apart from any socket: each
// handler reads its request's body and returns the Reply to write -- the whole answer at once
// (the status endpoints, /tokenize, a refusal) or a Call that generates and whose Replies follow.
// Endpoints, in SGLang's shapes: POST /generate, /abort_request, /flush_cache; GET /health,
// /health_generate, /get_model_info (/model_info), /get_server_info (/server_info), /get_load,
// /metrics; OpenAI's POST /v1/completions, /v1/chat/completions, /v1/responses, GET /v1/models;
// vLLM's POST /tokenize, /detokenize. What every call shares lives here: the step loop, the model's
// limits, the rids of the requests in flight, the trace.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/api/call.h"
#include "core/api/protocol.h"
#include "core/serve/serving_core.h"
#include "core/util/status.h"

namespace kvrt::api {

// What the server reports about itself (GET /get_server_info is the step loop's snapshot).
struct ServerInfo {
  std::string model_info;  // GET /get_model_info's JSON
  std::string model_name;  // what /v1/models lists and OpenAI answers name by default
};

// The API's own options (the [server] table's; http::ServerOptions holds them all).
struct ServiceOptions {
  // "": none; else each finished request is appended as one JSONL line in the format
  // `kvrt bench --trace` replays (http::ServerOptions::record_trace).
  std::string record_trace;
  // /generate streams: false (SGLang's default), each event has the text and output_ids so
  // far; true (SGLang's --incremental-streaming-output), the new ones only.
  bool incremental_streaming_output = false;
  // /metrics: "kvrt", "sglang" or "both".
  std::string metric_names = "both";
};

// A request as the API sees it: its path (no query) and its body.
struct Request {
  std::string_view path;
  std::string_view body;
};
// What a handler gives the transport: the Reply to write now and, when the request generates,
// its Call (null when it was answered at once or refused), for the transport to abort when the
// client goes away; the call's later Replies come through `post`.
struct Handled {
  Reply reply;
  std::shared_ptr<Call> call;
};
using Handler = std::function<Handled(const Request& request, const Post& post)>;
struct Route {
  const char* method;  // "GET", "POST"
  const char* path;
  Handler handler;
};

class Service {
 public:
  Service(ServiceOptions options, serve::StepLoop& loop, ModelLimits limits, ServerInfo info);
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;

  // Opens record_trace for appending (an error names it) and starts the trace's clock.
  Status start();
  // Every endpoint, in the order a 405 lists a path's methods.
  std::vector<Route> routes();

  // For the calls.
  serve::StepLoop& loop() { return loop_; }
  const ModelLimits& limits() const { return limits_; }
  const ServiceOptions& options() const { return options_; }
  // /abort_request finds a submitted request by its rid (the candidates of one prompt, n or
  // best_of > 1, share it).
  void remember_rid(const std::string& rid, uint64_t id);
  void forget_rid(const std::string& rid, uint64_t id);
  // One finished request, with the sampling it ran with (its seed drawn or given), so that a
  // replay samples as it did; nothing without record_trace.
  void record(std::chrono::steady_clock::time_point arrival, const GenerateResult& r,
              const sampling::SamplingParams& sampling);

 private:
  Handled generate(const Request& request, const Post& post);
  Handled health_generate(const Post& post);
  // A call started: kept while it runs, with what its start wrote.
  static Handled started(std::shared_ptr<Call> call);
  // status.cc: the endpoints answered at once.
  Reply health();
  Reply metrics();
  Reply get_load();
  Reply abort_request(const Request& request);
  Reply tokenize(const Request& request);
  Reply flush_cache();
  Reply models();
  // /metrics' text from the snapshot's (kvrt: names): metric_names says which names go out.
  std::string metrics_text(const std::string& kvrt) const;

  ServiceOptions options_;
  serve::StepLoop& loop_;
  ModelLimits limits_;
  ServerInfo info_;
  std::mutex rid_mutex_;
  std::unordered_multimap<std::string, uint64_t> rids_;
  // record_trace: the file, and when the server started (the trace's time 0).
  std::mutex trace_mutex_;
  std::ofstream trace_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
};

}  // namespace kvrt::api
