#include "core/server/http_server.h"

#include <pthread.h>
#include <sys/socket.h>
#include <spdlog/spdlog.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <deque>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/metrics/metrics.h"
#include "core/text/utf8.h"
#include "core/util/text.h"

namespace kvrt::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

class Session;

struct HttpServer::Impl {
  ServerOptions options;
  serve::StepLoop& loop;
  ModelLimits limits;
  ServerInfo info;
  std::vector<int32_t> eos_ids;
  net::io_context ioc;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  tcp::acceptor acceptor;
  std::vector<std::thread> threads;
  std::atomic<int> connections{0};
  std::atomic<bool> accepting{false};
  // Client rids of the requests in flight, for /abort_request.
  std::mutex rid_mutex;
  // (The candidates of one prompt, n or best_of > 1, share its rid.)
  std::unordered_multimap<std::string, uint64_t> rids;
  // record_trace: the file, and when the server started (the trace's time 0).
  std::mutex trace_mutex;
  std::ofstream trace;
  Clock::time_point started = Clock::now();
  // One finished request, with the sampling it ran with (its seed drawn or given), so that a
  // replay samples as it did.
  void record(Clock::time_point arrival, const GenerateResult& r,
              const exec::SamplingParams& sampling) {
    if (!trace.is_open() || r.output_ids.empty()) return;
    const double at = std::chrono::duration<double>(arrival - started).count();
    json line = json::object();
    line["timestamp"] = std::round(at * 1e6) / 1e6;
    line["input_len"] = r.prompt_tokens;
    line["output_len"] = r.output_ids.size();
    line["temperature"] = util::shortest_decimal(sampling.temperature);
    line["top_p"] = util::shortest_decimal(sampling.top_p);
    line["top_k"] = sampling.top_k;
    line["min_p"] = util::shortest_decimal(sampling.min_p);
    line["seed"] = sampling.seed;
    if (sampling.frequency_penalty != 0) {
      line["frequency_penalty"] = util::shortest_decimal(sampling.frequency_penalty);
    }
    if (sampling.presence_penalty != 0) {
      line["presence_penalty"] = util::shortest_decimal(sampling.presence_penalty);
    }
    if (sampling.repetition_penalty != 1) {
      line["repetition_penalty"] = util::shortest_decimal(sampling.repetition_penalty);
    }
    std::lock_guard lock(trace_mutex);
    trace << line.dump() << '\n' << std::flush;
  }
  // /metrics' text from the snapshot's (kvrt: names): metric_names says which names go out.
  std::string metrics_text(const std::string& kvrt) const {
    if (options.metric_names == "kvrt") return kvrt;
    std::string sglang = metrics::renamed_exposition(kvrt, "kvrt:", "sglang:", "model_name",
                                                     info.model_name);
    return options.metric_names == "sglang" ? sglang : kvrt + sglang;
  }
  // Every open session, to close them at shutdown and to find an idle one past max_connections.
  std::mutex session_mutex;
  std::vector<std::weak_ptr<Session>> sessions;

  Impl(const ServerOptions& o, serve::StepLoop& l, ModelLimits m, ServerInfo i,
       std::vector<int32_t> eos)
      : options(o), loop(l), limits(m), info(std::move(i)), eos_ids(std::move(eos)),
        acceptor(net::make_strand(ioc)) {}
  void accept();
  // Past max_connections: closes an idle connection to make room, else the one that has spent
  // longest reading its header (a slow client's, or a slowloris'); false when every connection
  // has a whole request header (a request in progress).
  bool make_room();
};

// One connection: read a request, answer it (at once, or as its generation proceeds), then the
// next one on the same connection. Every handler runs on the connection's strand.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, HttpServer::Impl& server)
      : stream_(std::move(socket)), server_(server), timer_(stream_.get_executor()) {}
  ~Session() { server_.connections.fetch_sub(1); }

  void start() {
    net::dispatch(stream_.get_executor(), beast::bind_front_handler(&Session::read,
                                                                    shared_from_this()));
  }
  void close() {
    net::post(stream_.get_executor(), [self = shared_from_this()] { self->close_now(); });
  }
  // Closes the connection if it is idle now (and it is then no longer idle, so no other
  // accept picks it); false when it is not.
  bool close_if_idle() {
    if (!idle_.exchange(false)) return false;
    header_since_ = 0;  // (a fresh connection is both): no second accept picks it
    net::post(stream_.get_executor(), [self = shared_from_this()] { self->close_now(); });
    return true;
  }
  // Since when it has been reading a request header (steady clock ticks), 0 when it is not.
  Clock::rep header_since() const { return header_since_.load(); }
  // Closes the connection if it is still reading the header it began at `since`; false when it
  // has finished it meanwhile (its request then goes on).
  bool close_if_reading_header(Clock::rep since) {
    if (since == 0 || !header_since_.compare_exchange_strong(since, 0)) return false;
    idle_ = false;
    net::post(stream_.get_executor(), [self = shared_from_this()] { self->close_now(); });
    return true;
  }

 private:
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
  // What a read waits for, and so which timeout ends it.
  enum class Phase { kIdle, kHeader, kBody };

  void close_now() {
    closing_ = true;
    idle_ = false;
    timer_.cancel();
    abort_generation("the server is shutting down");
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  // The phase's timeout: when it fires, the read in flight is cancelled and on_read answers it.
  void arm_read_timer(Phase phase) {
    const HttpServer::Impl& s = server_;
    const double limit = phase == Phase::kIdle     ? s.options.idle_timeout_s
                         : phase == Phase::kHeader ? s.options.header_timeout_s
                                                   : s.options.body_timeout_s;
    phase_ = phase;
    const uint64_t armed = ++read_timer_;
    if (limit <= 0) return;
    timer_.expires_after(seconds(limit));
    timer_.async_wait([weak = weak_from_this(), armed](beast::error_code ec) {
      auto self = weak.lock();
      if (!self || ec || armed != self->read_timer_) return;
      self->timed_out_ = true;
      beast::error_code ignored;
      self->stream_.socket().cancel(ignored);
    });
  }
  void disarm_read_timer() {
    ++read_timer_;
    timer_.cancel();
  }

  void read() {
    if (closing_) return;
    parser_.emplace();
    parser_->body_limit(server_.options.max_body_bytes);
    stream_.expires_never();
    timed_out_ = false;
    if (buffer_.size() > 0) {
      idle_ = false;
      return read_header(/*arm=*/true);  // a pipelined request's bytes are already here
    }
    // Nothing yet: idle until the first byte. A fresh connection's header is due
    // header_timeout_s after the accept; a keep-alive one's wait is idle_timeout_s, and its
    // header is due header_timeout_s after that first byte.
    const bool fresh = fresh_;
    fresh_ = false;
    idle_ = true;
    // A fresh connection is reading its first header from the accept on (and a slowloris that
    // never sends a byte is as much in the way as one that sends a byte a second).
    if (fresh) begin_header();
    arm_read_timer(fresh ? Phase::kHeader : Phase::kIdle);
    stream_.async_read_some(buffer_.prepare(4096), [self = shared_from_this(), fresh](
                                                       beast::error_code ec, size_t n) {
      self->idle_ = false;
      self->buffer_.commit(n);
      if (ec || self->closing_) return self->on_read(ec, n);
      self->read_header(/*arm=*/!fresh);
    });
  }
  // `arm`: the header begins now (else it began at the accept, and its clock runs already).
  void read_header(bool arm) {
    if (arm) {
      arm_read_timer(Phase::kHeader);
      begin_header();
    }
    // The header first: a client that sends "Expect: 100-continue" waits for the interim answer
    // before its body (curl does for bodies over 1 MiB).
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              // Claimed by make_room meanwhile: its close is on the way.
                              if (self->header_since_.exchange(0) == 0 && !self->closing_) {
                                return;
                              }
                              if (ec) return self->on_read(ec, n);
                              self->read_body();
                            });
  }
  void begin_header() {
    // 0 means "not reading a header": a clock at its epoch reads as 1 tick later.
    header_since_ = std::max<Clock::rep>(Clock::now().time_since_epoch().count(), 1);
  }
  void read_body() {
    arm_read_timer(Phase::kBody);
    const auto& head = parser_->get();
    auto expect = head.find(http::field::expect);
    if (expect != head.end() && beast::iequals(expect->value(), "100-continue") &&
        head.version() >= 11 && !parser_->is_done()) {
      auto interim = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
      return net::async_write(stream_, net::buffer(*interim),
                              [self = shared_from_this(), interim](beast::error_code ec, size_t) {
                                if (ec) return self->on_read(ec, 0);
                                http::async_read(self->stream_, self->buffer_, *self->parser_,
                                                 beast::bind_front_handler(&Session::on_read,
                                                                           self));
                              });
    }
    http::async_read(stream_, buffer_, *parser_,
                     beast::bind_front_handler(&Session::on_read, shared_from_this()));
  }

  void on_read(beast::error_code ec, size_t) {
    const bool timed_out = timed_out_;
    disarm_read_timer();
    if (closing_) return shutdown_write();
    if (timed_out) {
      // Idle, or a fresh connection that never sent a byte: a plain close. A request begun and
      // not finished in time: 408, then a close (nginx's client_header/body_timeout).
      if (phase_ == Phase::kIdle ||
          (phase_ == Phase::kHeader && buffer_.size() == 0 && !parser_->got_some())) {
        return close_now();
      }
      keep_alive_ = false;
      const double limit = phase_ == Phase::kHeader ? server_.options.header_timeout_s
                                                    : server_.options.body_timeout_s;
      return respond(408, error_body({408, std::string("the request's ") +
                                               (phase_ == Phase::kHeader ? "header" : "body") +
                                               " did not arrive within " +
                                               (phase_ == Phase::kHeader ? "header_timeout_s"
                                                                         : "body_timeout_s") +
                                               " (" + util::fixed(limit, 1) + " s)",
                                      "", "request_timeout"}));
    }
    if (ec == http::error::end_of_stream || ec == net::error::operation_aborted) {
      return shutdown_write();
    }
    if (ec == http::error::body_limit) {
      keep_alive_ = false;
      return respond(413, error_body({413, "the request body is over max_body_bytes (" +
                                               std::to_string(server_.options.max_body_bytes) +
                                               ")", "", "invalid_request_error"}));
    }
    if (ec) {
      if (ec == net::error::connection_reset || ec == net::error::eof) return shutdown_write();
      keep_alive_ = false;
      return respond(400, error_body({400, "malformed HTTP request: " + ec.message(), "",
                                      "invalid_request_error"}));
    }
    request_ = parser_->release();
    keep_alive_ = request_.keep_alive();
    handle();
  }

  bool authorized() const {
    if (server_.options.api_key.empty()) return true;
    auto it = request_.find(http::field::authorization);
    return it != request_.end() && it->value() == "Bearer " + server_.options.api_key;
  }

  void handle() {
    const std::string target(request_.target());
    const std::string path = target.substr(0, target.find('?'));
    const http::verb verb = request_.method();
    if (!authorized()) {
      return respond(401, error_body({401, "missing or wrong API key (Authorization: Bearer KEY)",
                                      "", "authentication_error"}));
    }
    struct Route {
      const char* path;
      http::verb verb;
    };
    // SGLang's newer names (/server_info, /model_info) answer as the older ones do.
    static const Route kRoutes[] = {
        {"/generate", http::verb::post},        {"/abort_request", http::verb::post},
        {"/health", http::verb::get},           {"/health_generate", http::verb::get},
        {"/get_model_info", http::verb::get},   {"/get_server_info", http::verb::get},
        {"/model_info", http::verb::get},       {"/server_info", http::verb::get},
        {"/get_load", http::verb::get},         {"/metrics", http::verb::get},
        {"/v1/completions", http::verb::post},  {"/v1/chat/completions", http::verb::post},
        {"/v1/responses", http::verb::post},
        {"/v1/models", http::verb::get},        {"/flush_cache", http::verb::post},
        {"/flush_cache", http::verb::get},      {"/tokenize", http::verb::post},
        {"/detokenize", http::verb::post}};
    std::string verbs;
    bool found = false;
    for (const Route& r : kRoutes) {
      if (path != r.path) continue;
      found = found || r.verb == verb;
      verbs += (verbs.empty() ? "" : " or ") + std::string(http::to_string(r.verb));
    }
    if (verbs.empty()) {
      return respond(404, error_body({404, "no endpoint " + path, "", "not_found_error"}));
    }
    if (!found) {
      return respond(405, error_body({405, path + " takes " + verbs, "", "invalid_request_error"}));
    }
    if (path == "/health") {
      if (server_.loop.snapshot()->engine_broken) {
        return respond(503, error_body({503, "the engine is broken", "", "server_error"}));
      }
      return respond(200, "", "text/plain");
    }
    if (path == "/get_model_info" || path == "/model_info") {
      return respond(200, server_.info.model_info);
    }
    if (path == "/metrics") {
      return respond(200, server_.metrics_text(server_.loop.snapshot()->prometheus),
                     "text/plain; version=0.0.4");
    }
    if (path == "/get_server_info" || path == "/server_info") {
      return respond(200, server_.loop.snapshot()->description);
    }
    if (path == "/get_load") {
      // SGLang's shape: one entry per data-parallel rank (kvrt has one).
      const std::shared_ptr<const serve::LoopSnapshot> snap = server_.loop.snapshot();
      return respond(200, to_text(json::array({{{"dp_rank", 0},
                                                {"num_reqs", snap->running + snap->waiting},
                                                {"num_running_reqs", snap->running},
                                                {"num_waiting_reqs", snap->waiting},
                                                {"num_tokens", snap->tokens_in_use}}})));
    }
    if (path == "/abort_request") return abort_request();
    if (path == "/tokenize" || path == "/detokenize") {
      auto answer = path == "/tokenize" ? tokenize_json(request_.body(), server_.limits)
                                        : detokenize_json(request_.body(), server_.limits);
      if (auto* e = std::get_if<ApiError>(&answer)) return respond_error(*e);
      return respond(200, to_text(std::get<json>(answer)));
    }
    if (path == "/flush_cache") {
      // Refused while requests run, as SGLang does: their pages are in the cache.
      Result<uint64_t> flushed = server_.loop.call([](serve::ServingCore& core) {
        return core.flush_cache();
      });
      if (!flushed.ok()) return respond(400, error_body({400, flushed.status().message(), ""}));
      return respond(200, json{{"success", true},
                               {"flushed_pages", *flushed},
                               {"message", "the prefix cache is empty; a host tier keeps its "
                                           "copies"}}
                              .dump());
    }
    if (path == "/health_generate") {
      // One token from BOS (or id 0), through the whole serving path.
      const int32_t bos = server_.limits.tokenizer ? server_.limits.tokenizer->bos_id() : 0;
      GenerateCall call;
      call.prompts = {{bos >= 0 ? bos : 0}};
      call.rids = {""};
      call.max_new_tokens = 1;
      health_ = true;
      return generate(std::move(call));
    }
    if (path == "/v1/models") {
      const json model = {{"id", server_.info.model_name}, {"object", "model"},
                          {"created", unix_time()}, {"owned_by", "kvrt"}};
      return respond(200, to_text(json{{"object", "list"}, {"data", json::array({model})}}));
    }
    auto parsed = path == "/generate"        ? parse_generate(request_.body(), server_.limits)
                  : path == "/v1/responses" ? parse_responses(request_.body(), server_.limits)
                                            : parse_openai(request_.body(), server_.limits,
                                                           path == "/v1/chat/completions");
    if (auto* call = std::get_if<GenerateCall>(&parsed); call && call->model.empty()) {
      call->model = server_.info.model_name;
    }
    if (auto* e = std::get_if<ApiError>(&parsed)) return respond_error(*e);
    generate(std::move(std::get<GenerateCall>(parsed)));
  }

  void abort_request() {
    const json j = json::parse(request_.body(), nullptr, false);
    if (!j.is_object() || !j.contains("rid") || !j["rid"].is_string()) {
      return respond(400, error_body({400, "rid: expected a string", "rid"}));
    }
    std::vector<uint64_t> ids;
    {
      std::lock_guard lock(server_.rid_mutex);
      auto [from, to] = server_.rids.equal_range(j["rid"].get<std::string>());
      for (auto it = from; it != to; ++it) ids.push_back(it->second);
    }
    for (uint64_t id : ids) server_.loop.abort(id, "aborted by /abort_request");
    respond(200, json{{"success", !ids.empty()}}.dump());
  }

  static int64_t unix_time() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  // One id for the call, its choices told apart by index (as OpenAI's).
  std::string openai_id() const {
    const char* prefix = call_.dialect == Dialect::kChat        ? "chatcmpl-"
                         : call_.dialect == Dialect::kResponses ? "resp_"
                                                                : "cmpl-";
    return prefix + pending_[0].result.rid;
  }

  void generate(GenerateCall call) {
    call_ = std::move(call);
    // Unseeded: a fresh seed per call (recorded in the trace), so that two unseeded requests
    // are two draws, as in SGLang and vLLM, yet each can be replayed exactly.
    if (!call_.seeded) call_.sampling.seed = fresh_seed();
    created_ = unix_time();
    pending_.clear();
    const size_t per = candidates();
    pending_.resize(call_.prompts.size() * per);
    started_ = Clock::now();
    stop_ids_ = call_.stop_token_ids;
    if (!call_.ignore_eos) stop_ids_.insert(stop_ids_.end(), server_.eos_ids.begin(),
                                            server_.eos_ids.end());
    for (size_t k = 0; k < pending_.size(); ++k) {
      Pending& p = pending_[k];
      p.prompt = k / per;
      p.candidate = k % per;
      p.id = server_.loop.next_id();
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
    if (Status s = server_.loop.submit(std::move(batch), &refused); !s.ok()) {
      // Nothing of the call was submitted.
      pending_.clear();
      const ApiError e = refusal(s, call_, refused);
      if (health_) {
        health_ = false;
        return respond(503, error_body({503, e.message, "", "server_error"}));
      }
      return respond_error(e);
    }
    for (size_t i = 0; i < call_.prompts.size(); ++i) {
      pending_[i * per].submitted = true;
      remember_rid(pending_[i * per]);
    }
    answered_ = false;
    unfinished_ = pending_.size();
    if (server_.options.request_timeout_s > 0) {
      timer_.expires_after(seconds(server_.options.request_timeout_s));
      timer_.async_wait([weak = weak_from_this()](beast::error_code ec) {
        if (auto self = weak.lock(); self && !ec) {
          self->abort_generation("request_timeout_s (" +
                                 util::fixed(self->server_.options.request_timeout_s, 1) +
                                 " s) passed");
        }
      });
    }
    if (call_.stream) {
      // HTTP/1.0 has no chunked encoding: the events go out as they are and the connection's
      // close ends them.
      chunked_ = request_.version() >= 11;
      if (!chunked_) keep_alive_ = false;
      send_raw(std::string(chunked_ ? "HTTP/1.1" : "HTTP/1.0") +
               " 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n" +
               (chunked_ ? "Transfer-Encoding: chunked\r\n" : "") + "Connection: " +
               std::string(keep_alive_ ? "keep-alive" : "close") + "\r\n\r\n");
      if (call_.dialect == Dialect::kResponses) {
        // The response and its one message open before any text.
        sequence_ = 0;
        const json response = responses_json(call_, pending_[0].result, openai_id(), created_);
        send_chunk(sse_event(responses_event("response.created", sequence_++,
                                             {{"response", response}})));
        send_chunk(sse_event(responses_event("response.in_progress", sequence_++,
                                             {{"response", response}})));
        send_chunk(sse_event(responses_event(
            "response.output_item.added", sequence_++,
            {{"output_index", 0},
             {"item", {{"type", "message"}, {"id", message_id()}, {"status", "in_progress"},
                       {"role", "assistant"}, {"content", json::array()}}}})));
        send_chunk(sse_event(responses_event(
            "response.content_part.added", sequence_++,
            {{"item_id", message_id()}, {"output_index", 0}, {"content_index", 0},
             {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}})));
      }
    }
    watch_disconnect();
  }

  // The Responses API's message id, beside the response's ("resp_<rid>", "msg_<rid>").
  std::string message_id() const { return "msg_" + pending_[0].result.rid; }

  // The Responses stream's end: the text done, the part and the message closed, then the
  // response completed (incomplete at max_output_tokens; failed when aborted).
  void end_responses_stream(const Pending& p) {
    const json response = responses_json(call_, p.result, openai_id(), created_);
    if (!serve::completed(p.result.reason)) {
      json failed = response;
      failed["status"] = "failed";
      failed["error"] = {{"code", p.result.reason == serve::FinishReason::kEngineFailure
                                      ? "server_error"
                                      : "request_aborted"},
                         {"message", p.result.message}};
      send_chunk(sse_event(responses_event("response.failed", sequence_++,
                                           {{"response", failed}})));
      return;
    }
    const json part = {{"type", "output_text"}, {"text", p.result.text},
                       {"annotations", json::array()}};
    send_chunk(sse_event(responses_event("response.output_text.done", sequence_++,
                                         {{"item_id", message_id()}, {"output_index", 0},
                                          {"content_index", 0}, {"text", p.result.text},
                                          {"logprobs", json::array()}})));
    send_chunk(sse_event(responses_event("response.content_part.done", sequence_++,
                                         {{"item_id", message_id()}, {"output_index", 0},
                                          {"content_index", 0}, {"part", part}})));
    send_chunk(sse_event(responses_event("response.output_item.done", sequence_++,
                                         {{"output_index", 0}, {"item", response["output"][0]}})));
    send_chunk(sse_event(responses_event(
        response["status"] == "completed" ? "response.completed" : "response.incomplete",
        sequence_++, {{"response", response}})));
  }

  static uint64_t fresh_seed() {
    thread_local std::random_device entropy;
    return (static_cast<uint64_t>(entropy()) << 32) ^ entropy();
  }

  // The sampling of pending_[k]'s request: the call's, its seed its choice's own.
  exec::SamplingParams sampling_of(const Pending& p) const {
    exec::SamplingParams sampling = call_.sampling;
    sampling.seed = choice_seed(call_.sampling.seed, p.candidate);
    return sampling;
  }

  // Requests per prompt: n, or best_of when it asks for more (the n best are answered).
  size_t candidates() const {
    return static_cast<size_t>(std::max({call_.n, call_.best_of, int32_t{1}}));
  }

  // The request of pending_[k], with the sink that brings its outputs back here.
  std::pair<serve::GenerateRequest, serve::RequestSink> request_for(size_t k) {
    const Pending& p = pending_[k];
    serve::GenerateRequest r;
    r.id = p.id;
    r.input_ids = call_.prompts[p.prompt];
    r.max_new_tokens = call_.max_new_tokens;
    // Each candidate its own seed stream; best_of ranks by the candidates' log-probabilities.
    r.sampling = sampling_of(p);
    if (call_.best_of > call_.n) r.sampling.logprobs = std::max(r.sampling.logprobs, 0);
    r.stop_token_ids = stop_ids_;
    r.stop = call_.stop;
    // A first candidate with others to follow streams, so its first token is heard.
    r.stream = call_.stream || (p.candidate == 0 && candidates() > 1);
    // The sinks keep the session alive until the request ends (the core drops them then), so
    // its answer always has a connection to go to.
    serve::RequestSink sink = [self = shared_from_this(), k](serve::RequestOutput out) {
      net::post(self->stream_.get_executor(),
                [self, k, out = std::move(out)] { self->on_output(k, out); });
    };
    return {std::move(r), std::move(sink)};
  }

  // /abort_request finds a submitted request by its rid.
  void remember_rid(const Pending& p) {
    std::lock_guard lock(server_.rid_mutex);
    server_.rids.emplace(p.result.rid, p.id);
  }

  // The other candidates of `prompt`, once its first has a token; when it ended without one
  // (aborted, failed) they end as it did.
  void submit_rest(size_t prompt) {
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
      s = server_.loop.submit(std::move(batch), &refused);
    }
    for (size_t k = prompt * per + 1; k < (prompt + 1) * per; ++k) {
      Pending& p = pending_[k];
      if (p.submitted || p.result.finished) continue;
      if (s.ok()) {
        p.submitted = true;
        remember_rid(p);
        continue;
      }
      serve::RequestOutput end;
      end.id = p.id;
      end.finished = true;
      end.finish_reason = first.finished && !serve::completed(first.reason)
                              ? first.reason
                              : serve::FinishReason::kAborted;
      end.message = s.message();
      on_output(k, end);
    }
  }

  // A client that goes away aborts its request. Only a close or a reset says so: the socket
  // turning readable can also be the next bytes of a request not yet whole (python requests
  // writes headers and body apart) or a wake-up with nothing behind it, so the watch looks with
  // a non-blocking peek and waits again unless the read would end the stream or fail.
  void watch_disconnect() {
    // A wait left from an earlier exchange on this keep-alive connection fires when the next
    // request's bytes arrive (and are read at once): it must not abort the new one.
    const uint64_t exchange = ++exchange_;
    rearm_disconnect_watch(exchange);
  }
  void rearm_disconnect_watch(uint64_t exchange) {
    stream_.socket().async_wait(
        tcp::socket::wait_read, [self = shared_from_this(), exchange](beast::error_code ec) {
          if (self->unfinished_ == 0 || exchange != self->exchange_) return;
          const bool open = !ec && self->peer_open();
          const size_t available = open ? self->stream_.socket().available(ec) : 0;
          if (open && !ec) {
            // Bytes of a pipelined request are left for the next read; nothing yet: wait again.
            if (available == 0) self->rearm_disconnect_watch(exchange);
            return;
          }
          self->abort_generation("the client disconnected");
          self->client_gone_ = true;
        });
  }
  // False when the peer closed its side (a read would return 0) or reset the connection.
  bool peer_open() {
    char byte;
    const ssize_t n = ::recv(stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
  }

  void abort_generation(const std::string& reason) {
    for (size_t k = 0; k < pending_.size(); ++k) {
      const Pending& p = pending_[k];
      if (p.result.finished) continue;
      if (p.submitted) {
        server_.loop.abort(p.id, reason);
      } else {
        // Never submitted (a candidate waiting for its prompt's first): it ends here.
        serve::RequestOutput end;
        end.id = p.id;
        end.finished = true;
        end.finish_reason = serve::FinishReason::kAborted;
        end.message = reason;
        on_output(k, end);
      }
    }
  }

  void on_output(size_t k, const serve::RequestOutput& out) {
    if (k >= pending_.size() || pending_[k].id != out.id) return;
    Pending& p = pending_[k];
    if (p.result.finished) return;
    const bool first_output = p.result.output_ids.empty() && !p.result.finished;
    p.result.add(out);
    if (out.finished) {
      p.result.e2e_latency = std::chrono::duration<double>(Clock::now() - started_).count();
      server_.record(started_, p.result, sampling_of(p));
      --unfinished_;
    }
    if (call_.stream && unfinished_ > 0) stream_chunk(p);
    if (first_output && p.candidate == 0 && candidates() > 1) submit_rest(p.prompt);
    if (out.finished && unfinished_ == 0) answer(p);
  }

  // Every request of the call has ended (`last` the last to): the answer.
  void answer(Pending& last) {
    if (answered_) return;
    answered_ = true;
    timer_.cancel();
    forget_rids();
    if (health_) {
      health_ = false;
      return serve::completed(last.result.reason)
                 ? respond(200, "", "text/plain")
                 : respond(503, error_body({503, last.result.message, "", "server_error"}));
    }
    if (call_.stream && call_.dialect == Dialect::kResponses) {
      stream_chunk(last);
      end_responses_stream(last);
      if (chunked_) send_raw("0\r\n\r\n");
      after_response();
      return;
    }
    if (call_.stream) {
      stream_chunk(last);
      if (call_.include_usage) {
        send_chunk("data: " +
                   to_text(openai_usage_chunk(call_, shown_results(), openai_id(), created_)) +
                   "\n\n");
      }
      send_chunk("data: [DONE]\n\n");
      if (chunked_) send_raw("0\r\n\r\n");
      after_response();
      return;
    }
    const bool openai = call_.dialect != Dialect::kGenerate;
    for (const Pending& q : pending_) {
      // An engine failure is a 500 in every API; an abort is an error only in OpenAI's, whose
      // finish reasons are "stop" and "length" (SGLang's /generate answers finish_reason abort).
      if (q.result.reason == serve::FinishReason::kEngineFailure ||
          (openai && !serve::completed(q.result.reason))) {
        return respond_error(openai_abort_error(q.result));
      }
    }
    std::vector<GenerateResult> results = shown_results();
    if (call_.dialect == Dialect::kResponses) {
      return respond(200, to_text(responses_json(call_, results[0], openai_id(), created_)));
    }
    if (openai) return respond(200, to_text(openai_json(call_, results, openai_id(), created_)));
    json body;
    if (call_.batch || candidates() > 1) {
      body = json::array();
      for (const GenerateResult& r : results) body.push_back(generate_json(call_, r));
    } else {
      body = generate_json(call_, results[0]);
    }
    respond(200, to_text(body));
  }

  // The answered results in choice order (prompt by prompt, n each): with best_of > n, the n of
  // each prompt's candidates with the highest cumulative log-probability.
  std::vector<GenerateResult> shown_results() const {
    const size_t per = candidates();
    const auto n = static_cast<size_t>(std::max(call_.n, int32_t{1}));
    std::vector<GenerateResult> shown;
    for (size_t i = 0; i * per < pending_.size(); ++i) {
      std::vector<const GenerateResult*> group;
      for (size_t k = i * per; k < (i + 1) * per; ++k) group.push_back(&pending_[k].result);
      if (per > n) {
        auto total = [](const GenerateResult* r) {
          double sum = 0;
          for (const exec::SampledLogprobs& e : r->logprobs) sum += e.chosen.logprob;
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

  void forget_rids() {
    std::lock_guard lock(server_.rid_mutex);
    for (const Pending& p : pending_) {
      auto [from, to] = server_.rids.equal_range(p.result.rid);
      for (auto it = from; it != to; ++it) {
        if (it->second == p.id) {
          server_.rids.erase(it);
          break;
        }
      }
    }
  }

  // One server-sent event: SGLang's with the text and the output ids so far (the new ones
  // alone with incremental_streaming_output), OpenAI's with the text since the last chunk (or,
  // for an aborted request, OpenAI's error object).
  void stream_chunk(Pending& p) {
    if (call_.dialect == Dialect::kGenerate) {
      const bool incremental = server_.options.incremental_streaming_output;
      const std::string event =
          incremental ? to_text(generate_json(call_, p.result, p.sent_ids, p.sent_text))
                      : generate_event(call_, p.result, &p.event_cache);
      p.sent_ids = p.result.output_ids.size();
      p.sent_text = p.result.text.size();
      return send_chunk("data: " + event + "\n\n");
    }
    if (call_.dialect == Dialect::kResponses) {
      const std::string delta =
          p.result.text.substr(std::min(p.sent_text, p.result.text.size()));
      p.sent_text = p.result.text.size();
      if (delta.empty()) return;
      return send_chunk(sse_event(responses_event(
          "response.output_text.delta", sequence_++,
          {{"item_id", message_id()}, {"output_index", 0}, {"content_index", 0},
           {"delta", delta}, {"logprobs", json::array()}})));
    }
    if (p.result.finished && !serve::completed(p.result.reason)) {
      return send_chunk("data: " + error_body(openai_abort_error(p.result)) + "\n\n");
    }
    const std::string delta = p.result.text.substr(std::min(p.sent_text, p.result.text.size()));
    if (delta.empty() && !p.result.finished) return;  // its ids' log-probabilities wait too
    // completions' text_offset: from the characters sent before this chunk.
    const size_t offset = text::utf8_characters(std::string_view(p.result.text).substr(
        0, std::min(p.sent_text, p.result.text.size())));
    p.sent_text = p.result.text.size();
    const std::span<const exec::SampledLogprobs> logprobs =
        std::span<const exec::SampledLogprobs>(p.result.logprobs)
            .subspan(std::min(p.sent_logprobs, p.result.logprobs.size()));
    p.sent_logprobs = p.result.logprobs.size();
    const size_t index = p.prompt * static_cast<size_t>(std::max(call_.n, int32_t{1})) +
                         p.candidate;  // the choice's index, as OpenAI orders them
    send_chunk("data: " +
               to_text(openai_chunk(call_, p.result, delta, openai_id(), created_, index,
                                    logprobs, offset)) +
               "\n\n");
  }

  void send_chunk(const std::string& data) {
    if (!chunked_) return send_raw(data);
    char size[20];
    const auto end = std::to_chars(size, size + sizeof size, data.size(), 16).ptr;
    std::string bytes;
    bytes.reserve(static_cast<size_t>(end - size) + data.size() + 4);
    bytes.append(size, end).append("\r\n").append(data).append("\r\n");
    send_raw(std::move(bytes));
  }

  // Writes in order: bytes queued while a write is in flight go out together in the next one.
  // After a failed write nothing more is written: the client is gone, and Asio, having found the
  // socket's error once, would wait for a readiness that never comes (the connection then held
  // open until shutdown).
  void send_raw(std::string bytes) {
    if (write_failed_) return;
    if (writing_.empty()) {
      writing_ = std::move(bytes);
      write_next();
    } else {
      queued_ += bytes;
    }
  }
  void write_next() {
    net::async_write(stream_, net::buffer(writing_),
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (ec) {
                         self->write_failed_ = true;
                         self->abort_generation("the client disconnected");
                         self->client_gone_ = true;
                         self->writing_.clear();
                         self->queued_.clear();
                         return;
                       }
                       self->writing_.swap(self->queued_);
                       self->queued_.clear();
                       if (!self->writing_.empty()) {
                         self->write_next();
                       } else if (self->read_after_writes_) {
                         self->read_after_writes_ = false;
                         self->finish_exchange();
                       }
                     });
  }

  void respond_error(const ApiError& e) {
    http::response<http::string_body> res{static_cast<http::status>(e.status), request_.version()};
    // "Full now": the client may retry; nothing else is worth a retry.
    if (e.type == "server_overloaded") res.set(http::field::retry_after, "1");
    res.set(http::field::content_type, "application/json");
    res.body() = error_body(e);
    finish_response(std::move(res));
  }

  void respond(int status, std::string body, const char* type = "application/json") {
    http::response<http::string_body> res{static_cast<http::status>(status), request_.version()};
    res.set(http::field::content_type, type);
    res.body() = std::move(body);
    finish_response(std::move(res));
  }

  void finish_response(http::response<http::string_body> res) {
    if (write_failed_) return shutdown_write();
    res.set(http::field::server, "kvrt");
    res.keep_alive(keep_alive_);
    res.prepare_payload();
    auto shared = std::make_shared<http::response<http::string_body>>(std::move(res));
    http::async_write(stream_, *shared,
                      [self = shared_from_this(), shared](beast::error_code ec, size_t) {
                        if (ec) return self->shutdown_write();
                        self->finish_exchange();
                      });
  }

  void after_response() {
    if (writing_.empty()) return finish_exchange();
    read_after_writes_ = true;
  }

  void finish_exchange() {
    health_ = false;
    pending_.clear();
    if (!keep_alive_ || client_gone_) return shutdown_write();
    read();
  }

  void shutdown_write() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
  }

  beast::tcp_stream stream_;
  HttpServer::Impl& server_;
  net::steady_timer timer_;  // the read phase's timeout, then the request's (request_timeout_s)
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::request<http::string_body> request_;
  std::atomic<bool> idle_{false};
  std::atomic<Clock::rep> header_since_{0};  // header_since()
  bool fresh_ = true;  // no request read yet
  Phase phase_ = Phase::kHeader;
  uint64_t read_timer_ = 0;  // counts armings, so a stale expiry is ignored
  bool timed_out_ = false;
  bool keep_alive_ = true;
  bool chunked_ = true;  // a stream's events in chunked encoding (HTTP/1.1)
  bool closing_ = false;
  bool client_gone_ = false;
  bool write_failed_ = false;  // a write on this connection failed: nothing more is sent
  bool health_ = false;
  bool read_after_writes_ = false;
  GenerateCall call_;
  std::vector<int32_t> stop_ids_;  // the call's stop ids and, unless ignore_eos, the model's EOS
  bool answered_ = false;          // the call's answer went out (or began to)
  int64_t sequence_ = 0;           // a Responses stream's next sequence_number
  std::vector<Pending> pending_;
  size_t unfinished_ = 0;
  uint64_t exchange_ = 0;  // counts generations on this connection (watch_disconnect)
  Clock::time_point started_;
  int64_t created_ = 0;  // OpenAI's "created", Unix seconds
  std::string writing_;  // the bytes of the write in flight ("" when none)
  std::string queued_;   // what comes after them
};

void HttpServer::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (!accepting.load()) return;
    if (!ec) {
      beast::error_code ignored;
      if (connections.fetch_add(1) >= options.max_connections && !make_room()) {
        connections.fetch_sub(1);
        // Every connection is busy: 503 and a close. What the client sent is drained first so
        // that the close is not a reset that loses the answer.
        static const std::string kFull =
            "HTTP/1.1 503 Service Unavailable\r\nServer: kvrt\r\nRetry-After: 1\r\n"
            "Content-Type: application/json\r\nConnection: close\r\nContent-Length: " +
            std::to_string(error_body({503, "every connection is busy (max_connections)", "",
                                       "server_overloaded"})
                               .size()) +
            "\r\n\r\n" +
            error_body({503, "every connection is busy (max_connections)", "",
                        "server_overloaded"});
        socket.non_blocking(true, ignored);
        socket.write_some(net::buffer(kFull), ignored);
        socket.shutdown(tcp::socket::shutdown_send, ignored);
        char drain[4096];
        while (socket.read_some(net::buffer(drain), ignored) > 0) {
        }
        socket.close(ignored);
      } else {
        // Streamed events are small writes: without TCP_NODELAY, Nagle's algorithm holds each
        // one back until the last is acknowledged, and delayed ACKs make that up to 40 ms.
        socket.set_option(tcp::no_delay(true), ignored);
        auto session = std::make_shared<Session>(std::move(socket), *this);
        {
          std::lock_guard lock(session_mutex);
          std::erase_if(sessions, [](const std::weak_ptr<Session>& w) { return w.expired(); });
          sessions.push_back(session);
        }
        session->start();
      }
    }
    accept();
  });
}

bool HttpServer::Impl::make_room() {
  std::lock_guard lock(session_mutex);
  for (const std::weak_ptr<Session>& w : sessions) {
    std::shared_ptr<Session> s = w.lock();
    if (s && s->close_if_idle()) return true;
  }
  // No idle one: the longest in its header. A client that sends whole requests gets its turn
  // however many connections trickle their headers; a slow client loses only a header it had
  // header_timeout_s to finish anyway. (One that finishes between the look and the close keeps
  // its request, and the next oldest is tried.)
  for (;;) {
    std::shared_ptr<Session> oldest;
    Clock::rep oldest_since = 0;
    for (const std::weak_ptr<Session>& w : sessions) {
      std::shared_ptr<Session> s = w.lock();
      const Clock::rep since = s ? s->header_since() : 0;
      if (since != 0 && (oldest == nullptr || since < oldest_since)) {
        oldest = std::move(s);
        oldest_since = since;
      }
    }
    if (oldest == nullptr) return false;
    if (oldest->close_if_reading_header(oldest_since)) return true;
  }
}

ServerOptions server_options(const config::Config& cfg) {
  ServerOptions o;
  o.host = cfg.server.host;
  o.port = cfg.server.port;
  o.network_threads = cfg.server.network_threads;
  o.max_connections = cfg.server.max_connections;
  o.max_body_bytes = static_cast<uint64_t>(cfg.server.max_body_bytes);
  o.request_timeout_s = cfg.server.request_timeout_s;
  o.header_timeout_s = cfg.server.header_timeout_s;
  o.body_timeout_s = cfg.server.body_timeout_s;
  o.idle_timeout_s = cfg.server.idle_timeout_s;
  o.api_key = cfg.server.api_key;
  o.record_trace = cfg.server.record_trace;
  o.incremental_streaming_output = cfg.server.incremental_streaming_output;
  o.metric_names = cfg.server.metric_names;
  return o;
}

HttpServer::HttpServer(const ServerOptions& options, serve::StepLoop& loop, ModelLimits limits,
                       ServerInfo info, std::vector<int32_t> eos_ids)
    : impl_(std::make_unique<Impl>(options, loop, limits, std::move(info), std::move(eos_ids))) {}

HttpServer::~HttpServer() { shutdown(); }

Status HttpServer::start() {
  Impl& s = *impl_;
  beast::error_code ec;
  const net::ip::address address = net::ip::make_address(s.options.host, ec);
  if (ec) return Status::ConfigError("server.host: '" + s.options.host + "': " + ec.message());
  const tcp::endpoint endpoint(address, static_cast<uint16_t>(s.options.port));
  const std::string where = s.options.host + ":" + std::to_string(s.options.port);
  s.acceptor.open(endpoint.protocol(), ec);
  if (!ec) s.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) s.acceptor.bind(endpoint, ec);
  if (!ec) s.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return Status::InvalidArgument("cannot listen on " + where + ": " + ec.message());
  port_ = s.acceptor.local_endpoint().port();
  if (!s.options.record_trace.empty()) {
    s.trace.open(s.options.record_trace, std::ios::app);
    if (!s.trace) {
      return Status::NotFound("server.record_trace: cannot open '" + s.options.record_trace +
                              "' for appending");
    }
  }
  s.started = Clock::now();
  s.accepting = true;
  s.work.emplace(s.ioc.get_executor());
  s.accept();
  for (int i = 0; i < s.options.network_threads; ++i) {
    s.threads.emplace_back([&s] {
      pthread_setname_np(pthread_self(), "kvrt-net");  // as top -H and /proc/PID/task name it
      s.ioc.run();
    });
  }
  return Status::Ok();
}

void HttpServer::stop_accepting() {
  Impl& s = *impl_;
  if (!s.accepting.exchange(false)) return;
  net::post(s.acceptor.get_executor(), [&s] {
    beast::error_code ec;
    s.acceptor.close(ec);
  });
}

void HttpServer::shutdown() {
  Impl& s = *impl_;
  stop_accepting();
  std::vector<std::shared_ptr<Session>> open;
  {
    std::lock_guard lock(s.session_mutex);
    for (auto& w : s.sessions) {
      if (auto p = w.lock()) open.push_back(std::move(p));
    }
    s.sessions.clear();
  }
  for (auto& session : open) session->close();
  open.clear();
  s.work.reset();
  for (std::thread& t : s.threads) t.join();
  s.threads.clear();
}

int HttpServer::open_connections() const { return impl_->connections.load(); }

}  // namespace kvrt::server
