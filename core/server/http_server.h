// kvrt serve's HTTP/1.1 server (Boost.Beast over Asio): a few network threads, a strand per
// connection, keep-alive, no thread per connection. A body is read into a GenerateCall
// (api.h), each prompt submitted to the StepLoop as a serve::GenerateRequest, and each
// serve::RequestOutput posted back to its connection and answered in the call's API. Endpoints,
// in SGLang's shapes: POST /generate (streaming or not), POST /abort_request, GET /health,
// /health_generate, /get_model_info, /get_server_info, /metrics, POST /flush_cache; and
// OpenAI's POST /v1/completions, /v1/chat/completions (streaming or not), GET /v1/models; and
// vLLM's POST /tokenize, /detokenize. /metrics, /get_server_info and /health read the step
// loop's snapshot and never wait on it. An engine failure ends the requests of its batch with a
// 500; the rest go on.
//
// Slow and idle clients: a connection has header_timeout_s from its accept, or from the first
// byte of its next request, to a complete header, and body_timeout_s from there to the whole
// body (else 408 and a close); a keep-alive connection idle for idle_timeout_s between requests
// is closed. Past max_connections, an idle connection is closed to make room, else the one that
// has spent longest reading its header (so connections that trickle their headers cannot lock
// out a client that sends whole requests); when every connection has a request in progress, the
// new one gets 503 and a close.
//
// Sampling: what a request leaves unset is ModelLimits::defaults' (api.h); an unseeded call gets
// a fresh seed from std::random_device, which the trace records.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/config/config.h"
#include "core/serve/step_loop.h"
#include "core/server/api.h"
#include "core/util/status.h"

namespace kvrt::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 30000;  // 0: any free port (port() says which)
  int network_threads = 2;
  int max_connections = 4096;
  uint64_t max_body_bytes = 16 << 20;
  double request_timeout_s = 600;
  double header_timeout_s = 10;
  double body_timeout_s = 30;
  double idle_timeout_s = 60;
  std::string api_key;  // "": none
  // "": none; else each finished request is appended as one JSONL line in the format
  // `kvrt bench --trace` replays: {"timestamp", "input_len", "output_len", "temperature",
  // "top_p", "top_k", "min_p", "seed"}, and frequency_penalty, presence_penalty and
  // repetition_penalty when they are set (the seed the request ran with, drawn when unseeded).
  std::string record_trace;
  // /generate streams: false (SGLang's default), each event has the text and output_ids so
  // far; true (SGLang's --incremental-streaming-output), the new ones only.
  bool incremental_streaming_output = false;
  // /metrics: "kvrt" (kvrt:...), "sglang" (sglang:..., with SGLang's model_name label) or
  // "both".
  std::string metric_names = "both";
};

// The [server] table's options (the listening port, the timeouts, the stream and metric shapes).
ServerOptions server_options(const config::Config& cfg);

// What the server reports about itself (GET /get_server_info is the step loop's snapshot).
struct ServerInfo {
  std::string model_info;  // GET /get_model_info's JSON
  std::string model_name;  // what /v1/models lists and OpenAI answers name by default
};

class HttpServer {
 public:
  HttpServer(const ServerOptions& options, serve::StepLoop& loop, ModelLimits limits,
             ServerInfo info, std::vector<int32_t> eos_ids);
  ~HttpServer();  // shutdown()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds, listens and starts the network threads; an address in use is an error naming it.
  Status start();
  uint16_t port() const { return port_; }
  // No new connections; open ones finish what they are doing.
  void stop_accepting();
  // Closes every connection and joins the network threads.
  void shutdown();
  int open_connections() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  uint16_t port_ = 0;
};

}  // namespace kvrt::server
