// kvrt serve's HTTP/1.1 transport (Boost.Beast over Asio): a few network threads, a strand per
// connection, keep-alive, no thread per connection. Each request is routed (session.h: Router)
// to the API layer (api::Service, core/api), which answers it through its connection (session.h): a
// body, or a stream of server-sent events. The transport knows nothing of generation.
//
// Slow and idle clients: a connection has header_timeout_s from its accept, or from the first
// byte of its next request, to a complete header, and body_timeout_s from there to the whole
// body (else 408 and a close); a keep-alive connection idle for idle_timeout_s between requests
// is closed. Past max_connections, an idle connection is closed to make room, else the one that
// has spent longest reading its header (so connections that trickle their headers cannot lock
// out a client that sends whole requests); when every connection has a request in progress, the
// new one gets 503 and a close. A generating request runs at most request_timeout_s, and a
// client that goes away (a close or a reset) aborts it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/api/protocol.h"
#include "core/api/service.h"
#include "core/config/config.h"
#include "core/serve/serving_core.h"
#include "core/util/status.h"

namespace kvrt::http {

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

// (GET /get_server_info etc.: api::ServerInfo.)
using ServerInfo = api::ServerInfo;
using ModelLimits = api::ModelLimits;

class HttpServer {
 public:
  // The API (api::Service) over `loop`, with the model's limits, what it reports of itself and
  // its EOS ids (a request stops at them unless it ignores them).
  HttpServer(const ServerOptions& options, serve::StepLoop& loop, ModelLimits limits,
             ServerInfo info);
  ~HttpServer();  // shutdown()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds, listens and starts the network threads; an address in use is an error naming it,
  // as is a record_trace file that cannot be opened.
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

}  // namespace kvrt::http
