#include "core/http/session.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <utility>

#include "core/util/text.h"

namespace kvrt::http {

using api::error_body;

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

Router::Router(std::vector<api::Route> routes) {
  for (api::Route& r : routes) {
    entries_.push_back({r.path, bhttp::string_to_verb(r.method), std::move(r.handler)});
  }
}

Router::Match Router::find(bhttp::verb method, const std::string& path) const {
  Match match;
  for (const Entry& e : entries_) {
    if (path != e.path) continue;
    if (e.method == method && match.handler == nullptr) match.handler = &e.handler;
    match.allowed += (match.allowed.empty() ? "" : " or ") +
                     std::string(bhttp::to_string(e.method));
  }
  if (match.handler == nullptr) match.status = match.allowed.empty() ? 404 : 405;
  return match;
}

Session::Session(tcp::socket socket, HttpServer::Impl& server)
    : stream_(std::move(socket)), server_(server), timer_(stream_.get_executor()) {}

Session::~Session() { server_.connections.fetch_sub(1); }

void Session::start() {
  net::dispatch(stream_.get_executor(),
                beast::bind_front_handler(&Session::read, shared_from_this()));
}

void Session::close() {
  net::post(stream_.get_executor(), [self = shared_from_this()] { self->close_now(); });
}

bool Session::close_if_idle() {
  if (!idle_.exchange(false)) return false;
  header_since_ = 0;  // (a fresh connection is both): no second accept picks it
  net::post(stream_.get_executor(), [self = shared_from_this()] { self->close_now(); });
  return true;
}

bool Session::close_if_reading_header(Clock::rep since) {
  if (since == 0 || !header_since_.compare_exchange_strong(since, 0)) return false;
  idle_ = false;
  net::post(stream_.get_executor(), [self = shared_from_this()] { self->close_now(); });
  return true;
}

void Session::close_now() {
  closing_ = true;
  idle_ = false;
  timer_.cancel();
  abort_generation("the server is shutting down");
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
  stream_.close();
}

// The phase's timeout: when it fires, the read in flight is cancelled and on_read answers it.
void Session::arm_read_timer(Phase phase) {
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

void Session::disarm_read_timer() {
  ++read_timer_;
  timer_.cancel();
}

void Session::read() {
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
void Session::read_header(bool arm) {
  if (arm) {
    arm_read_timer(Phase::kHeader);
    begin_header();
  }
  // The header first: a client that sends "Expect: 100-continue" waits for the interim answer
  // before its body (curl does for bodies over 1 MiB).
  bhttp::async_read_header(stream_, buffer_, *parser_,
                          [self = shared_from_this()](beast::error_code ec, size_t n) {
                            // Claimed by make_room meanwhile: its close is on the way.
                            if (self->header_since_.exchange(0) == 0 && !self->closing_) {
                              return;
                            }
                            if (ec) return self->on_read(ec, n);
                            self->read_body();
                          });
}

void Session::begin_header() {
  // 0 means "not reading a header": a clock at its epoch reads as 1 tick later.
  header_since_ = std::max<Clock::rep>(Clock::now().time_since_epoch().count(), 1);
}

void Session::read_body() {
  arm_read_timer(Phase::kBody);
  const auto& head = parser_->get();
  auto expect = head.find(bhttp::field::expect);
  if (expect != head.end() && beast::iequals(expect->value(), "100-continue") &&
      head.version() >= 11 && !parser_->is_done()) {
    auto interim = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
    return net::async_write(stream_, net::buffer(*interim),
                            [self = shared_from_this(), interim](beast::error_code ec, size_t) {
                              if (ec) return self->on_read(ec, 0);
                              bhttp::async_read(self->stream_, self->buffer_, *self->parser_,
                                               beast::bind_front_handler(&Session::on_read,
                                                                         self));
                            });
  }
  bhttp::async_read(stream_, buffer_, *parser_,
                   beast::bind_front_handler(&Session::on_read, shared_from_this()));
}

void Session::on_read(beast::error_code ec, size_t) {
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
    return respond_json_body(408, error_body({408, std::string("the request's ") +
                                             (phase_ == Phase::kHeader ? "header" : "body") +
                                             " did not arrive within " +
                                             (phase_ == Phase::kHeader ? "header_timeout_s"
                                                                       : "body_timeout_s") +
                                             " (" + util::fixed(limit, 1) + " s)",
                                    "", "request_timeout"}));
  }
  if (ec == bhttp::error::end_of_stream || ec == net::error::operation_aborted) {
    return shutdown_write();
  }
  if (ec == bhttp::error::body_limit) {
    keep_alive_ = false;
    return respond_json_body(413, error_body({413, "the request body is over max_body_bytes (" +
                                             std::to_string(server_.options.max_body_bytes) +
                                             ")", "", "invalid_request_error"}));
  }
  if (ec) {
    if (ec == net::error::connection_reset || ec == net::error::eof) return shutdown_write();
    keep_alive_ = false;
    return respond_json_body(400, error_body({400, "malformed HTTP request: " + ec.message(), "",
                                    "invalid_request_error"}));
  }
  request_ = parser_->release();
  keep_alive_ = request_.keep_alive();
  handle();
}

bool Session::authorized() const {
  if (server_.options.api_key.empty()) return true;
  auto it = request_.find(bhttp::field::authorization);
  return it != request_.end() && it->value() == "Bearer " + server_.options.api_key;
}

// A client that goes away aborts its request. Only a close or a reset says so: the socket
// turning readable can also be the next bytes of a request not yet whole (python requests
// writes headers and body apart) or a wake-up with nothing behind it, so the watch looks with
// a non-blocking peek and waits again unless the read would end the stream or fail.
void Session::watch_disconnect() {
  // A wait left from an earlier exchange on this keep-alive connection fires when the next
  // request's bytes arrive (and are read at once): it must not abort the new one.
  const uint64_t exchange = ++exchange_;
  rearm_disconnect_watch(exchange);
}

void Session::rearm_disconnect_watch(uint64_t exchange) {
  stream_.socket().async_wait(
      tcp::socket::wait_read, [self = shared_from_this(), exchange](beast::error_code ec) {
        if (!self->call_ || self->call_->unfinished() == 0 || exchange != self->exchange_) {
          return;
        }
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
bool Session::peer_open() {
  char byte;
  const ssize_t n = ::recv(stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
}

// Writes in order: bytes queued while a write is in flight go out together in the next one.
// After a failed write nothing more is written: the client is gone, and Asio, having found the
// socket's error once, would wait for a readiness that never comes (the connection then held
// open until shutdown).
void Session::send_raw(std::string bytes) {
  if (write_failed_) return;
  if (writing_.empty()) {
    writing_ = std::move(bytes);
    write_next();
  } else {
    queued_ += bytes;
  }
}

void Session::write_next() {
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

void Session::finish_response(bhttp::response<bhttp::string_body> res) {
  if (write_failed_) return shutdown_write();
  res.set(bhttp::field::server, "kvrt");
  res.keep_alive(keep_alive_);
  res.prepare_payload();
  auto shared = std::make_shared<bhttp::response<bhttp::string_body>>(std::move(res));
  bhttp::async_write(stream_, *shared,
                    [self = shared_from_this(), shared](beast::error_code ec, size_t) {
                      if (ec) return self->shutdown_write();
                      self->finish_exchange();
                    });
}

void Session::after_response() {
  if (writing_.empty()) return finish_exchange();
  read_after_writes_ = true;
}

void Session::finish_exchange() {
  call_.reset();
  if (!keep_alive_ || client_gone_) return shutdown_write();
  read();
}

void Session::shutdown_write() {
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
}

// Routes the request to the API layer; a generating call is then watched: its client going
// away, or request_timeout_s passing, aborts it.
void Session::handle() {
  const std::string target(request_.target());
  const std::string path = target.substr(0, target.find('?'));
  if (!authorized()) {
    return respond_json_body(401, api::error_body({401, "missing or wrong API key "
                                                        "(Authorization: Bearer KEY)",
                                                   "", "authentication_error"}));
  }
  const Router::Match match = server_.router.find(request_.method(), path);
  if (match.status == 404) {
    return respond_json_body(404,
                             api::error_body({404, "no endpoint " + path, "", "not_found_error"}));
  }
  if (match.status == 405) {
    return respond_json_body(405, api::error_body({405, path + " takes " + match.allowed, "",
                                                   "invalid_request_error"}));
  }
  api::Handled handled = (*match.handler)(api::Request{path, request_.body()}, poster());
  call_ = std::move(handled.call);
  write(std::move(handled.reply));
  if (call_ == nullptr) return;  // answered at once (or refused)
  if (server_.options.request_timeout_s > 0) {
    timer_.expires_after(seconds(server_.options.request_timeout_s));
    timer_.async_wait([weak = weak_from_this(), call = std::weak_ptr<api::Call>(call_)](
                          beast::error_code ec) {
      auto self = weak.lock();
      auto running = call.lock();
      if (self && running && !ec) {
        self->write(running->abort("request_timeout_s (" +
                                   util::fixed(self->server_.options.request_timeout_s, 1) +
                                   " s) passed"));
      }
    });
  }
  watch_disconnect();
}

void Session::abort_generation(const std::string& reason) {
  if (call_) write(call_->abort(reason));
}

void Session::write(api::Reply reply) {
  if (reply.answer) {
    api::Reply::Answer& a = *reply.answer;
    return respond(a.status, std::move(a.body), a.content_type, a.retry_after);
  }
  if (reply.begin_stream) begin_stream();
  for (const std::string& event : reply.events) write_event(event);
  if (reply.end_stream) end_stream();
}

api::Post Session::poster() {
  return [self = shared_from_this()](std::function<api::Reply()> task) {
    net::post(self->stream_.get_executor(),
              [self, task = std::move(task)] { self->write(task()); });
  };
}

void Session::respond_json_body(int status, std::string body) {
  respond(status, std::move(body), "application/json", false);
}

void Session::respond(int status, std::string body, const char* content_type, bool retry_after) {
  timer_.cancel();  // a call's request_timeout_s: it is answered
  bhttp::response<bhttp::string_body> res{static_cast<bhttp::status>(status),
                                          request_.version()};
  if (retry_after) res.set(bhttp::field::retry_after, "1");
  res.set(bhttp::field::content_type, content_type);
  res.body() = std::move(body);
  finish_response(std::move(res));
}

// HTTP/1.0 has no chunked encoding: the events go out as they are and the connection's close
// ends them.
void Session::begin_stream() {
  chunked_ = request_.version() >= 11;
  if (!chunked_) keep_alive_ = false;
  send_raw(std::string(chunked_ ? "HTTP/1.1" : "HTTP/1.0") +
           " 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n" +
           (chunked_ ? "Transfer-Encoding: chunked\r\n" : "") + "Connection: " +
           std::string(keep_alive_ ? "keep-alive" : "close") + "\r\n\r\n");
}

void Session::write_event(const std::string& data) {
  if (!chunked_) return send_raw(data);
  char size[20];
  const auto end = std::to_chars(size, size + sizeof size, data.size(), 16).ptr;
  std::string bytes;
  bytes.reserve(static_cast<size_t>(end - size) + data.size() + 4);
  bytes.append(size, end).append("\r\n").append(data).append("\r\n");
  send_raw(std::move(bytes));
}

void Session::end_stream() {
  timer_.cancel();  // a call's request_timeout_s: it is answered
  if (chunked_) send_raw("0\r\n\r\n");
  after_response();
}

}  // namespace kvrt::http
