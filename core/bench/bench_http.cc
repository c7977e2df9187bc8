#include "core/bench/bench_http.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

#include "core/util/progress.h"

namespace kvrt::bench {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A server metric under SGLang's name with kvrt's or SGLang's prefix, or vLLM's name.
std::optional<double> metric(const std::map<std::string, double>& m, const std::string& name,
                             const char* vllm_name = nullptr) {
  for (const char* prefix : {"kvrt:", "sglang:"}) {
    if (auto it = m.find(prefix + name); it != m.end()) return it->second;
  }
  if (vllm_name != nullptr) {
    if (auto it = m.find(std::string("vllm:") + vllm_name); it != m.end()) return it->second;
  }
  return std::nullopt;
}

// The message of an error answer: OpenAI's / kvrt's {"error": {"message"}}, else the body.
std::string error_message(int status, const std::string& body) {
  std::string message = body.substr(0, 300);
  const json j = json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error")) {
    const json& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string()) {
      message = e["message"].get<std::string>();
    } else if (e.is_string()) {
      message = e.get<std::string>();
    }
  }
  return "HTTP " + std::to_string(status) + ": " + message;
}

class HttpDriver {
 public:
  HttpDriver(const HttpBenchOptions& options, const WorkloadSpec& workload)
      : options_(options),
        workload_(workload),
        client_(options.url, client::ClientOptions{options.api_key, options.timeout_s}) {}

  Result<BenchReport> run();

 private:
  struct Flight {
    PlannedRequest plan;
    std::vector<int32_t> prompt, output;  // the whole prompt sent; the ids streamed back
    Clock::time_point sent, last;
    bool has_token = false;
    int64_t events = 0;  // streamed events that carried output
    int64_t prompt_tokens = -1, completion_tokens = -1, cached_tokens = 0;
    std::string finish;  // the finish_reason's type once one came
    std::string message;
    std::string head;  // the body's first bytes, for an error answer
    client::SseParser sse;
  };

  Status probe();
  void send(PlannedRequest p);
  std::string body_of(const Flight& f) const;
  const char* path() const;  // the endpoint the backend posts to
  void on_event(Flight& f, std::string_view data);
  void on_tokens(Flight& f, int64_t n);
  void on_done(uint64_t id, const client::Response& response);
  void sample_metrics();
  void progress(bool last);

  const HttpBenchOptions& options_;
  const WorkloadSpec& workload_;
  client::HttpClient client_;
  std::optional<WorkloadPlan> plan_;
  std::string model_;  // OpenAI's "model"
  BenchReport report_;
  ClientSamples samples_;
  std::unordered_map<uint64_t, Flight> flights_;
  std::unordered_map<uint64_t, std::string> texts_;  // --backend responses: each prompt's text
  std::deque<PlannedRequest> pending_, ready_;
  Clock::time_point start_, first_send_{}, last_end_{};
  std::map<std::string, double> metrics_start_;
  bool scraping_ = false;
  uint64_t scrapes_ = 0;
  double running_sum_ = 0, queue_sum_ = 0, usage_sum_ = 0;
};

// What the server is: its vocabulary (for the prompts' ids), its model name (for OpenAI), its
// store and pool; and its metrics before the run.
Status HttpDriver::probe() {
  const std::string where = options_.url.text;
  client::Response info = client_.fetch("GET", "/get_model_info");
  if (info.status == 0) {
    return Status::InvalidArgument("kvrt bench --url " + where + ": " + info.error);
  }
  int32_t vocab = options_.vocab_size;
  if (info.status == 200) {
    const json j = json::parse(info.body, nullptr, false);
    if (vocab == 0 && j.is_object() && j.contains("vocab_size") &&
        j["vocab_size"].is_number_integer()) {
      vocab = j["vocab_size"].get<int32_t>();
    }
  }
  if (vocab <= 1) {
    return Status::InvalidArgument("kvrt bench --url " + where +
                                   ": the server's /get_model_info gives no vocab_size "
                                   "(HTTP " + std::to_string(info.status) +
                                   "); give --vocab-size N");
  }
  plan_.emplace(workload_, vocab);
  std::string model = options_.model;
  if (options_.backend != "generate" && model.empty()) {
    client::Response models = client_.fetch("GET", "/v1/models");
    const json j = json::parse(models.body, nullptr, false);
    if (models.status == 200 && j.is_object() && j.contains("data") && j["data"].is_array() &&
        !j["data"].empty() && j["data"][0].is_object() && j["data"][0].contains("id") &&
        j["data"][0]["id"].is_string()) {
      model = j["data"][0]["id"].get<std::string>();
    } else {
      model = "default";
    }
  }
  model_ = model;
  report_.endpoint = where + " (POST " + path() + ", streamed)";
  report_.store = "(not reported by the server)";
  client::Response server = client_.fetch("GET", "/get_server_info");
  if (server.status == 200) {
    const json j = json::parse(server.body, nullptr, false);
    if (j.is_object() && j.contains("kv_store") && j["kv_store"].is_object() &&
        j["kv_store"].contains("name") && j["kv_store"]["name"].is_string()) {
      report_.store = j["kv_store"]["name"].get<std::string>();
    }
    if (j.is_object() && j.contains("max_total_num_tokens") &&
        j["max_total_num_tokens"].is_number_unsigned()) {
      report_.max_total_num_tokens = j["max_total_num_tokens"].get<uint64_t>();
    }
  }
  client::Response m = client_.fetch("GET", "/metrics");
  if (m.status == 200) metrics_start_ = client::parse_prometheus(m.body);
  if (metrics_start_.empty()) {
    spdlog::warn("kvrt bench: {}/metrics gave no metrics (HTTP {}): running, queue and token "
                 "usage are not reported, and server throughput is the clients' count",
                 where, m.status);
  }
  return Status::Ok();
}

const char* HttpDriver::path() const {
  return options_.backend == "openai"      ? "/v1/completions"
         : options_.backend == "responses" ? "/v1/responses"
                                           : "/generate";
}

// A trace request's sampling as the API's fields (the names /generate's sampling_params and
// OpenAI's completions share); greedy, temperature 0 alone, for every other request.
json sampling_fields(const std::optional<sampling::SamplingParams>& sampling) {
  if (!sampling) return {{"temperature", 0}};
  const sampling::SamplingParams& p = *sampling;
  json fields = {{"temperature", p.temperature},
                 {"top_p", p.top_p},
                 {"top_k", p.top_k},
                 {"min_p", p.min_p},
                 {"seed", p.seed}};
  if (p.frequency_penalty != 0) fields["frequency_penalty"] = p.frequency_penalty;
  if (p.presence_penalty != 0) fields["presence_penalty"] = p.presence_penalty;
  if (p.repetition_penalty != 1) fields["repetition_penalty"] = p.repetition_penalty;
  return fields;
}

std::string HttpDriver::body_of(const Flight& f) const {
  // The in-process bench's requests: exactly max_new_tokens (no end-of-sequence stop), greedy
  // unless a trace says how each sampled.
  const json sampling = sampling_fields(f.plan.sampling);
  if (options_.backend == "responses") {
    // The prompt as text (the server's /detokenize gave it), through the chat template: the
    // server's prompt is the template's tokens longer. The Responses API samples with
    // temperature and top_p alone (it has no seed: a sampled trace replays as a new draw).
    json body = {{"model", model_},
                 {"input", texts_.at(f.plan.id)},
                 {"max_output_tokens", f.plan.max_new_tokens},
                 {"ignore_eos", true},
                 {"store", false},
                 {"stream", true}};
    for (const char* key : {"temperature", "top_p"}) {
      if (sampling.contains(key)) body[key] = sampling[key];
    }
    return body.dump();
  }
  if (options_.backend == "openai") {
    json body = {
        {"model", model_},    {"prompt", f.prompt}, {"max_tokens", f.plan.max_new_tokens},
        {"ignore_eos", true}, {"stream", true},     {"stream_options", {{"include_usage", true}}}};
    body.update(sampling);
    return body.dump();
  }
  json params = {{"max_new_tokens", f.plan.max_new_tokens}, {"ignore_eos", true}};
  params.update(sampling);
  return json{{"input_ids", f.prompt}, {"sampling_params", params}, {"stream", true}}.dump();
}

void HttpDriver::send(PlannedRequest p) {
  const uint64_t id = p.id;
  Flight& f = flights_[id];
  f.prompt = p.prompt;
  f.plan = std::move(p);
  f.sent = Clock::now();
  if (first_send_ == Clock::time_point{}) first_send_ = f.sent;
  client_.start(
      "POST", path(), body_of(f),
      [this, id](std::string_view bytes) {
        Flight& g = flights_.at(id);
        if (g.head.size() < 4096) g.head.append(bytes.substr(0, 4096 - g.head.size()));
        g.sse.feed(bytes, [this, &g](std::string_view data) { on_event(g, data); });
      },
      [this, id](client::Response r) { on_done(id, r); });
}

void HttpDriver::on_tokens(Flight& f, int64_t n) {
  if (n <= 0) return;
  const Clock::time_point now = Clock::now();
  if (!f.has_token) {
    samples_.ttft.push_back(seconds(now - f.sent));
    // Tokens that came in the same event as the first had no gap of their own.
    for (int64_t i = 1; i < n; ++i) samples_.itl.push_back(0);
  } else {
    const double gap = seconds(now - f.last) / static_cast<double>(n);
    for (int64_t i = 0; i < n; ++i) samples_.itl.push_back(gap);
  }
  f.last = now;
  f.has_token = true;
  ++f.events;
}

void HttpDriver::on_event(Flight& f, std::string_view data) {
  if (data == "[DONE]") return;
  const json j = json::parse(data, nullptr, false);
  if (!j.is_object()) return;
  if (j.contains("error")) {
    f.finish = "abort";
    f.message = error_message(200, std::string(data));
    return;
  }
  // A field of the type expected, else nothing (a foreign server's answer is not trusted).
  auto text_of = [](const json& o, const char* key) {
    return o.is_object() && o.contains(key) && o[key].is_string() ? o[key].get<std::string>()
                                                                  : std::string();
  };
  auto read_int = [](const json& o, const char* key, int64_t* out) {
    if (o.is_object() && o.contains(key) && o[key].is_number_integer()) {
      *out = o[key].get<int64_t>();
    }
  };
  if (options_.backend == "responses") {
    const std::string type = text_of(j, "type");
    if (type == "response.output_text.delta") on_tokens(f, 1);  // one delta per token
    if (type == "response.completed" || type == "response.incomplete" ||
        type == "response.failed") {
      f.finish = type == "response.completed"    ? "stop"
                 : type == "response.incomplete" ? "length"
                                                 : "abort";
      const json& r = j.contains("response") ? j["response"] : j;
      if (r.is_object() && r.contains("error")) f.message = text_of(r["error"], "message");
      if (r.is_object() && r.contains("usage")) {
        const json& u = r["usage"];
        read_int(u, "output_tokens", &f.completion_tokens);
        read_int(u, "input_tokens", &f.prompt_tokens);
        if (u.is_object() && u.contains("input_tokens_details")) {
          read_int(u["input_tokens_details"], "cached_tokens", &f.cached_tokens);
        }
      }
    }
    return;
  }
  if (options_.backend == "openai") {
    if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
      const json& c = j["choices"][0];
      // One event per token is what servers send; the usage block gives the true count.
      if (c.contains("text") && c["text"].is_string() && !c["text"].get<std::string>().empty()) {
        on_tokens(f, 1);
      }
      if (c.contains("finish_reason") && c["finish_reason"].is_string()) {
        f.finish = c["finish_reason"].get<std::string>();
      }
    }
    if (j.contains("usage") && j["usage"].is_object()) {
      const json& u = j["usage"];
      if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer()) {
        f.completion_tokens = u["completion_tokens"].get<int64_t>();
      }
      if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number_integer()) {
        f.prompt_tokens = u["prompt_tokens"].get<int64_t>();
      }
      if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object() &&
          u["prompt_tokens_details"].contains("cached_tokens") &&
          u["prompt_tokens_details"]["cached_tokens"].is_number_integer()) {
        f.cached_tokens = u["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
      }
    }
    return;
  }
  if (j.contains("output_ids") && j["output_ids"].is_array()) {
    // SGLang sends the ids so far (and, with incremental streaming output, the new ones only):
    // meta_info.completion_tokens says how many there are, so the new ones are the last
    // completion_tokens - seen of the list either way.
    const json& ids = j["output_ids"];
    size_t fresh = ids.size();
    if (j.contains("meta_info") && j["meta_info"].is_object() &&
        j["meta_info"].contains("completion_tokens") &&
        j["meta_info"]["completion_tokens"].is_number_integer()) {
      const auto total = j["meta_info"]["completion_tokens"].get<int64_t>();
      const auto seen = static_cast<int64_t>(f.output.size());
      fresh = std::min(ids.size(), static_cast<size_t>(std::max<int64_t>(0, total - seen)));
    }
    for (size_t i = ids.size() - fresh; i < ids.size(); ++i) {
      if (ids[i].is_number_integer()) f.output.push_back(ids[i].get<int32_t>());
    }
    on_tokens(f, static_cast<int64_t>(fresh));
  }
  if (j.contains("meta_info") && j["meta_info"].is_object()) {
    const json& m = j["meta_info"];
    read_int(m, "prompt_tokens", &f.prompt_tokens);
    read_int(m, "completion_tokens", &f.completion_tokens);
    read_int(m, "cached_tokens", &f.cached_tokens);
    if (m.contains("finish_reason") && m["finish_reason"].is_object()) {
      const json& fr = m["finish_reason"];
      if (fr.contains("type") && fr["type"].is_string()) f.finish = fr["type"].get<std::string>();
      if (fr.contains("message") && fr["message"].is_string()) {
        f.message = fr["message"].get<std::string>();
      }
    }
  }
}

void HttpDriver::on_done(uint64_t id, const client::Response& response) {
  const Clock::time_point now = Clock::now();
  last_end_ = now;
  auto it = flights_.find(id);
  Flight& f = it->second;
  const int64_t completion =
      f.completion_tokens >= 0 ? f.completion_tokens : static_cast<int64_t>(f.output.size());
  report_.generated_tokens += static_cast<uint64_t>(std::max<int64_t>(completion, 0));
  bool ok = false;
  if (response.status == 0) {
    count_abort(response.error, &report_);
  } else if (response.status != 200) {
    count_abort(error_message(response.status, f.head), &report_);
  } else if (f.finish.empty()) {
    count_abort("the stream ended without a finish_reason", &report_);
  } else if (f.finish == "abort") {
    count_abort(f.message.empty() ? "aborted by the server" : f.message, &report_);
  } else {
    ok = true;
    ++report_.completed;
    report_.prompt_tokens += static_cast<uint64_t>(
        f.prompt_tokens >= 0 ? f.prompt_tokens : static_cast<int64_t>(f.prompt.size()));
    report_.cached_tokens += static_cast<uint64_t>(std::max<int64_t>(f.cached_tokens, 0));
    const double latency = seconds(now - f.sent);
    samples_.e2e.push_back(latency);
    if (latency > 0) samples_.effective.push_back(static_cast<double>(completion) / latency);
  }
  if (f.plan.conversation >= 0) {
    std::vector<int32_t> so_far = std::move(f.prompt);
    so_far.insert(so_far.end(), f.output.begin(), f.output.end());
    follow_conversation(*plan_, workload_, f.plan.conversation, f.plan.turn, ok,
                        std::move(so_far), &ready_, &report_);
  }
  flights_.erase(it);
}

void HttpDriver::sample_metrics() {
  if (scraping_ || metrics_start_.empty()) return;
  scraping_ = true;
  client_.start("GET", "/metrics", "", nullptr, [this](client::Response r) {
    scraping_ = false;
    if (r.status != 200 || flights_.empty()) return;
    const std::map<std::string, double> m = client::parse_prometheus(r.body);
    const double running = metric(m, "num_running_reqs", "num_requests_running").value_or(0);
    const double queued = metric(m, "num_queue_reqs", "num_requests_waiting").value_or(0);
    const double usage = metric(m, "token_usage", "gpu_cache_usage_perc").value_or(0);
    ++scrapes_;
    running_sum_ += running;
    queue_sum_ += queued;
    usage_sum_ += usage;
    report_.timeline.push_back({seconds(Clock::now() - start_), running, queued, usage});
    report_.max_running = std::max(report_.max_running, static_cast<int>(running));
  });
}

void HttpDriver::progress(bool last) {
  if (!options_.progress) return;
  const uint64_t done = report_.completed + report_.aborted;
  const uint64_t total = std::max<uint64_t>(report_.requests, 1);
  std::fprintf(stderr, "\r%s %llu/%llu requests, %zu in flight, %.1f s%s",
               util::progress_bar(done, total, 30).c_str(),
               static_cast<unsigned long long>(done), static_cast<unsigned long long>(total),
               flights_.size(), seconds(Clock::now() - start_), last ? "\n" : "");
  std::fflush(stderr);
}

Result<BenchReport> HttpDriver::run() {
  if (options_.backend != "generate" && options_.backend != "openai" &&
      options_.backend != "responses") {
    return Status::InvalidArgument("--backend '" + options_.backend +
                                   "': expected generate, openai or responses");
  }
  if (options_.backend != "generate" && workload_.turns > 1) {
    return Status::InvalidArgument(
        "kvrt bench --backend openai: " + workload_.source + " has " +
        std::to_string(workload_.turns) +
        " turns per conversation, and OpenAI's completions answer text, not the token ids a "
        "later turn must resend; use --backend generate");
  }
  if (Status s = probe(); !s.ok()) return s;
  report_.requests = plan_->total_requests();
  pending_.assign(plan_->initial().begin(), plan_->initial().end());
  if (options_.backend == "responses") {
    // The Responses API takes text: each prompt's ids as the server decodes them, before the
    // clock starts.
    for (const PlannedRequest& p : pending_) {
      client::Response r = client_.fetch("POST", "/detokenize", json{{"tokens", p.prompt}}.dump());
      const json j = json::parse(r.body, nullptr, false);
      if (r.status != 200 || !j.is_object() || !j.contains("prompt") || !j["prompt"].is_string()) {
        return Status::InvalidArgument(
            "kvrt bench --backend responses: " + options_.url.text +
            "/detokenize could not turn the prompts into text (HTTP " + std::to_string(r.status) +
            "): the Responses API needs a server with /detokenize (kvrt serve, vLLM)");
      }
      texts_[p.id] = j["prompt"].get<std::string>();
    }
  }

  start_ = Clock::now();
  const auto scrape_every = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(std::max(options_.scrape_interval_s, 0.05)));
  const auto progress_every = std::chrono::milliseconds(250);
  Clock::time_point next_scrape = start_, next_progress = start_;
  while (true) {
    auto room = [&] {
      return workload_.concurrency <= 0 ||
             static_cast<int>(flights_.size()) < workload_.concurrency;
    };
    while (!ready_.empty() && room()) {
      send(std::move(ready_.front()));
      ready_.pop_front();
    }
    const double now_s = seconds(Clock::now() - start_);
    while (!pending_.empty() && pending_.front().arrival_s <= now_s && room()) {
      send(std::move(pending_.front()));
      pending_.pop_front();
    }
    if (flights_.empty() && pending_.empty() && ready_.empty()) break;
    Clock::time_point now = Clock::now();
    if (now >= next_scrape && !flights_.empty()) {
      sample_metrics();
      next_scrape = now + scrape_every;
    }
    if (now >= next_progress) {
      progress(false);
      next_progress = now + progress_every;
    }
    Clock::time_point deadline = std::min(next_progress, now + std::chrono::milliseconds(100));
    if (!flights_.empty()) deadline = std::min(deadline, next_scrape);
    if (!pending_.empty() && room()) {
      deadline = std::min(deadline, start_ + std::chrono::duration_cast<Clock::duration>(
                                                 std::chrono::duration<double>(
                                                     pending_.front().arrival_s)));
    }
    client_.run_until(deadline);
  }
  while (scraping_) client_.run_until(Clock::now() + std::chrono::milliseconds(100));
  progress(true);
  report_.duration_s = seconds(Clock::now() - start_);

  // The server's side: its counters' growth over the run, its pool, its tier, its diagnosis.
  client::Response end = client_.fetch("GET", "/metrics");
  const std::map<std::string, double> m =
      end.status == 200 ? client::parse_prometheus(end.body) : std::map<std::string, double>{};
  if (end.status == 200) report_.prometheus = end.body;
  auto growth = [&](const std::string& name, const char* vllm) -> std::optional<double> {
    const std::optional<double> a = metric(metrics_start_, name, vllm), b = metric(m, name, vllm);
    if (!a || !b) return std::nullopt;
    return *b - *a;
  };
  const double active_s =
      first_send_ == Clock::time_point{} ? 0 : seconds(last_end_ - first_send_);
  const std::optional<double> generated = growth("generation_tokens_total",
                                                 "generation_tokens_total");
  const double server_generated =
      generated ? *generated : static_cast<double>(report_.generated_tokens);
  report_.server_gen_throughput = active_s > 0 ? server_generated / active_s : 0;
  report_.total_output_throughput =
      report_.duration_s > 0 ? static_cast<double>(report_.generated_tokens) / report_.duration_s
                             : 0;
  report_.retractions =
      static_cast<uint64_t>(std::max(0.0, growth("num_retractions_total", nullptr).value_or(0)));
  if (report_.max_total_num_tokens == 0) {
    report_.max_total_num_tokens =
        static_cast<uint64_t>(metric(m, "max_total_num_tokens").value_or(0));
  }
  report_.tier_loaded_tokens = static_cast<uint64_t>(
      std::max(0.0, growth("host_tier_loaded_tokens_total", nullptr).value_or(0)));
  if (std::optional<double> capacity = metric(m, "host_tier_capacity_pages")) {
    report_.host_tier = true;
    report_.tier.capacity_pages = static_cast<uint64_t>(*capacity);
    report_.tier.used_pages = static_cast<uint64_t>(metric(m, "host_tier_used_pages").value_or(0));
    report_.tier.saved_pages =
        static_cast<uint64_t>(metric(m, "host_tier_saved_pages_total").value_or(0));
    report_.tier.loaded_pages =
        static_cast<uint64_t>(metric(m, "host_tier_loaded_pages_total").value_or(0));
    report_.tier.evicted_pages =
        static_cast<uint64_t>(metric(m, "host_tier_dropped_pages_total").value_or(0));
  }
  if (scrapes_ > 0) {
    const double n = static_cast<double>(scrapes_);
    report_.mean_running = running_sum_ / n;
    report_.mean_queue = queue_sum_ / n;
    report_.mean_token_usage = usage_sum_ / n;
    report_.endpoint += ", /metrics sampled " + std::to_string(scrapes_) + " times";
  }
  fill_client_figures(samples_, &report_);
  client::Response info = client_.fetch("GET", "/get_server_info");
  const json j = info.status == 200 ? json::parse(info.body, nullptr, false) : json();
  report_.diagnosis.line =
      j.is_object() && j.contains("diagnosis") && j["diagnosis"].is_string()
          ? j["diagnosis"].get<std::string>() + " [the server's, over its whole life]"
          : "Diagnosis: the server reports none (GET /get_server_info has no \"diagnosis\")";
  return report_;
}

}  // namespace

Result<BenchReport> drive_http(const HttpBenchOptions& options, const WorkloadSpec& workload) {
  HttpDriver driver(options, workload);
  return driver.run();
}

}  // namespace kvrt::bench
