// `kvrt bench --url`: the same workloads and the same report as the in-process bench, sent over
// HTTP to a running server (kvrt serve, or any SGLang- or OpenAI-compatible one). Latencies come
// from the client's own clock, each token as its streamed event arrives; running, queue and
// token usage are sampled from the server's /metrics during the run; server-side throughput is
// its generation counter's growth over the run.
#pragma once

#include <string>

#include "core/bench/bench.h"
#include "core/client/http_client.h"

namespace kvrt::bench {

struct HttpBenchOptions {
  client::Url url;
  // "generate": SGLang's POST /generate with input_ids and streamed output_ids; "openai": POST
  // /v1/completions with the prompt as token ids, streamed, usage at the end.
  std::string backend = "generate";
  std::string api_key;
  std::string model;       // OpenAI's "model"; "": the first one /v1/models lists
  int32_t vocab_size = 0;  // prompt ids' range; 0: /get_model_info's vocab_size
  double scrape_interval_s = 0.5;
  bool progress = false;  // a progress line on stderr (a terminal's)
  double timeout_s = 600;
};

// Runs `workload` against the server; an unreachable server, a refused workload (multi-turn
// over "openai", which cannot carry the answers' ids) or a server that names no vocabulary
// size is an error before any request is sent.
Result<BenchReport> drive_http(const HttpBenchOptions& options, const WorkloadSpec& workload);

}  // namespace kvrt::bench
