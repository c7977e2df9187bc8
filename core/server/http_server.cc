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
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/sched/abort_reason.h"

namespace kvrt::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// How long a keep-alive connection may sit idle between requests.
constexpr auto kIdleTimeout = std::chrono::seconds(120);

}  // namespace

class Session;

struct HttpServer::Impl {
  ServerOptions options;
  StepLoop& loop;
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
  std::unordered_map<std::string, uint64_t> rids;
  // record_trace: the file, and when the server started (the trace's time 0).
  std::mutex trace_mutex;
  std::ofstream trace;
  Clock::time_point started = Clock::now();
  void record(Clock::time_point arrival, const GenerateResult& r) {
    if (!trace.is_open() || r.output_ids.empty()) return;
    const double at = std::chrono::duration<double>(arrival - started).count();
    const json line = {{"timestamp", std::round(at * 1e6) / 1e6},
                       {"input_len", r.prompt_tokens},
                       {"output_len", r.output_ids.size()}};
    std::lock_guard lock(trace_mutex);
    trace << line.dump() << '\n' << std::flush;
  }
  // Every open session, to close them at shutdown.
  std::mutex session_mutex;
  std::vector<std::weak_ptr<Session>> sessions;

  Impl(const ServerOptions& o, StepLoop& l, ModelLimits m, ServerInfo i, std::vector<int32_t> eos)
      : options(o), loop(l), limits(m), info(std::move(i)), eos_ids(std::move(eos)),
        acceptor(net::make_strand(ioc)) {}
  void accept();
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
    net::post(stream_.get_executor(), [self = shared_from_this()] {
      self->closing_ = true;
      self->timer_.cancel();
      self->abort_generation("the server is shutting down");
      beast::error_code ec;
      self->stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
      self->stream_.close();
    });
  }

 private:
  // One prompt of the /generate call being answered.
  struct Pending {
    uint64_t id = 0;
    GenerateResult result;
    std::vector<std::string> stop;
    bool stop_matched = false;  // a stop string ended it; its abort is on its way
    size_t sent_text = 0;       // streaming: text already sent
    size_t sent_ids = 0;
    size_t longest_stop = 0;
    std::optional<TextStream> text;
  };

  void read() {
    if (closing_) return;
    parser_.emplace();
    parser_->body_limit(server_.options.max_body_bytes);
    stream_.expires_after(kIdleTimeout);
    // The header first: a client that sends "Expect: 100-continue" waits for the interim answer
    // before its body (curl does for bodies over 1 MiB).
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              if (ec) return self->on_read(ec, n);
                              self->read_body();
                            });
  }
  void read_body() {
    const auto& head = parser_->get();
    auto expect = head.find(http::field::expect);
    if (expect != head.end() && beast::iequals(expect->value(), "100-continue") &&
        head.version() >= 11 && !parser_->is_done()) {
      auto interim = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
      return net::async_write(stream_, net::buffer(*interim),
                              [self = shared_from_this(), interim](beast::error_code ec, size_t) {
                                if (ec) return self->shutdown_write();
                                http::async_read(self->stream_, self->buffer_, *self->parser_,
                                                 beast::bind_front_handler(&Session::on_read,
                                                                           self));
                              });
    }
    http::async_read(stream_, buffer_, *parser_,
                     beast::bind_front_handler(&Session::on_read, shared_from_this()));
  }

  void on_read(beast::error_code ec, size_t) {
    if (ec == http::error::end_of_stream || ec == net::error::operation_aborted || closing_) {
      return shutdown_write();
    }
    if (ec == http::error::body_limit) {
      keep_alive_ = false;
      return respond(413, error_body({413, "the request body is over max_body_bytes (" +
                                               std::to_string(server_.options.max_body_bytes) +
                                               ")", "", "invalid_request_error"}));
    }
    if (ec) {
      if (ec == beast::error::timeout || ec == net::error::connection_reset ||
          ec == net::error::eof) {
        return shutdown_write();
      }
      keep_alive_ = false;
      return respond(400, error_body({400, "malformed HTTP request: " + ec.message(), "",
                                      "invalid_request_error"}));
    }
    request_ = parser_->release();
    keep_alive_ = request_.keep_alive();
    stream_.expires_never();
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
    static const Route kRoutes[] = {
        {"/generate", http::verb::post},        {"/abort_request", http::verb::post},
        {"/health", http::verb::get},           {"/health_generate", http::verb::get},
        {"/get_model_info", http::verb::get},   {"/get_server_info", http::verb::get},
        {"/metrics", http::verb::get},          {"/v1/completions", http::verb::post},
        {"/v1/chat/completions", http::verb::post}, {"/v1/models", http::verb::get},
        {"/flush_cache", http::verb::post},     {"/tokenize", http::verb::post},
        {"/detokenize", http::verb::post}};
    const Route* route = nullptr;
    for (const Route& r : kRoutes) {
      if (path == r.path) route = &r;
    }
    if (route == nullptr) {
      return respond(404, error_body({404, "no endpoint " + path, "", "not_found_error"}));
    }
    if (route->verb != verb) {
      return respond(405, error_body({405, path + " takes " +
                                               std::string(http::to_string(route->verb)),
                                      "", "invalid_request_error"}));
    }
    if (path == "/health") return respond(200, "", "text/plain");
    if (path == "/get_model_info") return respond(200, server_.info.model_info);
    if (path == "/metrics") {
      std::string text = server_.loop.call([](serve::ServingCore& core) {
        return core.prometheus();
      });
      return respond(200, std::move(text), "text/plain; version=0.0.4");
    }
    if (path == "/get_server_info") {
      auto info = server_.info.server_info;
      return respond(200, server_.loop.call([info](serve::ServingCore& core) {
        return info(core);
      }));
    }
    if (path == "/abort_request") return abort_request();
    if (path == "/tokenize" || path == "/detokenize") {
      auto answer = path == "/tokenize" ? tokenize_json(request_.body(), server_.limits)
                                        : detokenize_json(request_.body(), server_.limits);
      if (auto* e = std::get_if<ApiError>(&answer)) return respond(e->status, error_body(*e));
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
    auto parsed = path == "/generate"
                      ? parse_generate(request_.body(), server_.limits)
                      : parse_openai(request_.body(), server_.limits,
                                     path == "/v1/chat/completions");
    if (auto* call = std::get_if<GenerateCall>(&parsed); call && call->model.empty()) {
      call->model = server_.info.model_name;
    }
    if (auto* e = std::get_if<ApiError>(&parsed)) return respond(e->status, error_body(*e));
    generate(std::move(std::get<GenerateCall>(parsed)));
  }

  void abort_request() {
    const json j = json::parse(request_.body(), nullptr, false);
    if (!j.is_object() || !j.contains("rid") || !j["rid"].is_string()) {
      return respond(400, error_body({400, "rid: expected a string", "rid"}));
    }
    uint64_t id = 0;
    {
      std::lock_guard lock(server_.rid_mutex);
      auto it = server_.rids.find(j["rid"].get<std::string>());
      if (it != server_.rids.end()) id = it->second;
    }
    if (id != 0) server_.loop.abort(id, "aborted by /abort_request");
    respond(200, json{{"success", id != 0}}.dump());
  }

  static int64_t unix_time() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  std::string openai_id(const Pending& p) const {
    return (call_.dialect == Dialect::kChat ? "chatcmpl-" : "cmpl-") + p.result.rid;
  }

  void generate(GenerateCall call) {
    call_ = std::move(call);
    created_ = unix_time();
    pending_.clear();
    pending_.resize(call_.prompts.size());
    started_ = Clock::now();
    unfinished_ = call_.prompts.size();
    std::vector<int32_t> stop_ids = call_.stop_token_ids;
    if (!call_.ignore_eos) stop_ids.insert(stop_ids.end(), server_.eos_ids.begin(),
                                           server_.eos_ids.end());
    for (size_t i = 0; i < call_.prompts.size(); ++i) {
      Pending& p = pending_[i];
      p.id = server_.loop.next_id();
      p.result.rid = call_.rids[i].empty() ? std::to_string(p.id) : call_.rids[i];
      p.result.prompt_tokens = static_cast<int32_t>(call_.prompts[i].size());
      p.stop = call_.stop;
      for (const std::string& stop : p.stop) p.longest_stop = std::max(p.longest_stop, stop.size());
      // The prompt's last ids, as vLLM's incremental detokenizer starts from them.
      const std::vector<int32_t>& prompt = call_.prompts[i];
      p.text.emplace(server_.limits.tokenizer,
                     std::vector<int32_t>(prompt.end() - std::min<size_t>(prompt.size(), 4),
                                          prompt.end()));
      serve::GenerateRequest r;
      r.id = p.id;
      r.input_ids = call_.prompts[i];
      r.max_new_tokens = call_.max_new_tokens;
      r.sampling = call_.sampling;
      r.stop_token_ids = stop_ids;
      // The sinks keep the session alive until the request ends (the step loop drops them
      // then), so its answer always has a connection to go to.
      std::shared_ptr<Session> self = shared_from_this();
      RequestSink sink;
      sink.on_token = [self, i](const sched::Request&, int32_t token) {
        net::post(self->stream_.get_executor(), [self, i, token] { self->on_token(i, token); });
      };
      sink.on_finish = [self, i](const sched::Request& req, sched::FinishKind kind,
                                 const std::string& why, Fault fault) {
        const int64_t cached = req.cached_tokens;
        net::post(self->stream_.get_executor(), [self, i, kind, why, cached, fault] {
          self->on_finish(i, kind, why, cached, fault);
        });
      };
      if (!p.result.rid.empty()) {
        std::lock_guard lock(server_.rid_mutex);
        server_.rids[p.result.rid] = p.id;
      }
      if (!server_.loop.submit(std::move(r), std::move(sink))) {
        // The queue is full: nothing was submitted for this prompt; abort the ones that were.
        for (size_t k = 0; k < i; ++k) server_.loop.abort(pending_[k].id, "overloaded");
        forget_rids();
        overloaded_ = true;
        if (i == 0) {
          pending_.clear();
          return respond_overloaded();
        }
        unfinished_ = i;  // the rest never started; answer when those end
        pending_.resize(i);
        break;
      }
    }
    if (server_.options.request_timeout_s > 0) {
      timer_.expires_after(std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(server_.options.request_timeout_s)));
      timer_.async_wait([weak = weak_from_this()](beast::error_code ec) {
        if (auto self = weak.lock(); self && !ec) {
          self->abort_generation("request_timeout_s (" +
                                 std::to_string(self->server_.options.request_timeout_s) +
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
    }
    watch_disconnect();
  }

  void respond_overloaded() {
    http::response<http::string_body> res{http::status::service_unavailable, request_.version()};
    res.set(http::field::retry_after, "1");
    res.set(http::field::content_type, "application/json");
    res.body() = error_body({503, "the waiting queue is full (max_queued_requests); retry later",
                             "", "server_overloaded"});
    write(std::move(res));
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
    for (const Pending& p : pending_) {
      if (!p.result.finished) server_.loop.abort(p.id, reason);
    }
  }

  void on_token(size_t i, int32_t token) {
    Pending& p = pending_[i];
    if (p.result.finished || p.stop_matched) return;
    p.result.output_ids.push_back(token);
    if (server_.limits.tokenizer != nullptr) {
      const size_t searched = p.result.text.size();
      p.result.text = p.text->update(p.result.output_ids);
      // Only where a stop string could newly end: the fresh text and the bytes before it.
      const size_t from = searched >= p.longest_stop ? searched - p.longest_stop + 1 : 0;
      std::string matched;
      size_t at = p.stop.empty() ? std::string::npos
                                 : find_stop(std::string_view(p.result.text).substr(from), p.stop,
                                             &matched);
      if (at != std::string::npos) {
        at += from;
        p.result.text.resize(at);
        p.result.matched = matched;
        p.stop_matched = true;
        server_.loop.abort(p.id, "stop string");
      }
    }
    if (call_.stream) stream_chunk(p);
  }

  void on_finish(size_t i, sched::FinishKind kind, const std::string& why, int64_t cached,
                 Fault fault) {
    Pending& p = pending_[i];
    if (p.result.finished) return;
    p.result.finished = true;
    p.result.cached_tokens = cached;
    p.result.e2e_latency = std::chrono::duration<double>(Clock::now() - started_).count();
    if (p.stop_matched) {
      p.result.kind = Finish::kStop;
    } else {
      // The whole output decoded at once: exact, a character the last token left unfinished
      // included (it becomes U+FFFD in the JSON).
      if (server_.limits.tokenizer != nullptr) p.result.text = p.text->finish(p.result.output_ids);
      p.result.kind = kind == sched::FinishKind::kStop      ? Finish::kStop
                      : kind == sched::FinishKind::kLength  ? Finish::kLength
                                                            : Finish::kAbort;
      if (kind == sched::FinishKind::kStop && !p.result.output_ids.empty()) {
        p.result.matched = std::to_string(p.result.output_ids.back());
      }
      if (kind == sched::FinishKind::kAborted) p.result.message = why;
    }
    // Refused by the scheduler when submitted (too long for the pool, a bad sampling value):
    // the client's request was at fault.
    server_.record(started_, p.result);
    if (fault == Fault::kRequest && refusal_.empty()) refusal_ = why;
    if (fault == Fault::kEngine && engine_failure_.empty()) engine_failure_ = why;
    if (--unfinished_ > 0) {
      if (call_.stream) stream_chunk(p);
      return;
    }
    timer_.cancel();
    forget_rids();
    if (!refusal_.empty() && !call_.stream) {
      const std::string message = sched::without_request_id(refusal_);
      const std::string field = message.substr(0, message.find(':'));
      const bool named = field.find(' ') == std::string::npos && field.size() < message.size();
      return respond(400, error_body({400, message, named ? "sampling_params." + field : ""}));
    }
    if (!engine_failure_.empty() && !call_.stream) {
      return respond(500, error_body({500, engine_failure_, "", "server_error"}));
    }
    if (overloaded_) return respond_overloaded();
    if (health_) {
      health_ = false;
      return p.result.kind == Finish::kAbort
                 ? respond(503, error_body({503, p.result.message, "", "server_error"}))
                 : respond(200, "", "text/plain");
    }
    if (call_.stream) {
      stream_chunk(p);
      send_chunk("data: [DONE]\n\n");
      if (chunked_) send_raw("0\r\n\r\n");
      after_response();
      return;
    }
    if (call_.dialect != Dialect::kGenerate) {
      std::vector<GenerateResult> results;
      for (const Pending& q : pending_) results.push_back(q.result);
      return respond(200, to_text(openai_json(call_, results, openai_id(pending_[0]), created_)));
    }
    json body;
    if (call_.batch) {
      body = json::array();
      for (const Pending& q : pending_) body.push_back(generate_json(q.result));
    } else {
      body = generate_json(pending_[0].result);
    }
    respond(200, to_text(body));
  }

  void forget_rids() {
    std::lock_guard lock(server_.rid_mutex);
    for (const Pending& p : pending_) {
      auto it = server_.rids.find(p.result.rid);
      if (it != server_.rids.end() && it->second == p.id) server_.rids.erase(it);
    }
  }

  // One server-sent event with the cumulative text and the new output ids, as SGLang sends.
  void stream_chunk(Pending& p) {
    // An unfinished output's text stops short of what may be the start of a stop string.
    const size_t shown =
        p.result.finished ? p.result.text.size() : stop_safe_length(p.result.text, p.stop);
    if (call_.dialect != Dialect::kGenerate) {
      const std::string_view text = std::string_view(p.result.text).substr(0, shown);
      const std::string delta =
          text.size() > p.sent_text ? std::string(text.substr(p.sent_text)) : "";
      p.sent_text = std::max(p.sent_text, text.size());
      if (delta.empty() && !p.result.finished) return;
      send_chunk("data: " + to_text(openai_chunk(call_, p.result, delta, openai_id(p), created_)) +
                 "\n\n");
      return;
    }
    std::string text = std::move(p.result.text);
    p.result.text = text.substr(0, shown);
    const json event = generate_json(p.result, p.sent_ids);
    p.result.text = std::move(text);
    p.sent_ids = p.result.output_ids.size();
    send_chunk("data: " + to_text(event) + "\n\n");
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
  void send_raw(std::string bytes) {
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

  void respond(int status, std::string body, const char* type = "application/json") {
    http::response<http::string_body> res{static_cast<http::status>(status), request_.version()};
    res.set(http::field::server, "kvrt");
    res.set(http::field::content_type, type);
    res.keep_alive(keep_alive_);
    res.body() = std::move(body);
    write(std::move(res));
  }

  void write(http::response<http::string_body> res) {
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
    overloaded_ = false;
    refusal_.clear();
    engine_failure_.clear();
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
  net::steady_timer timer_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::request<http::string_body> request_;
  bool keep_alive_ = true;
  bool chunked_ = true;  // a stream's events in chunked encoding (HTTP/1.1)
  bool closing_ = false;
  bool client_gone_ = false;
  bool health_ = false;
  bool overloaded_ = false;
  bool read_after_writes_ = false;
  std::string refusal_;         // why the core refused a prompt at submit (a 400)
  std::string engine_failure_;  // why the engine failed a prompt's step (a 500)
  GenerateCall call_;
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
      if (connections.fetch_add(1) >= options.max_connections) {
        connections.fetch_sub(1);
        beast::error_code ignored;
        socket.close(ignored);  // over max_connections
      } else {
        // Streamed events are small writes: without TCP_NODELAY, Nagle's algorithm holds each
        // one back until the last is acknowledged, and delayed ACKs make that up to 40 ms.
        beast::error_code ignored;
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

HttpServer::HttpServer(const ServerOptions& options, StepLoop& loop, ModelLimits limits,
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
