// One connection of kvrt serve's HTTP server: it reads a request under the header, body and
// idle timeouts, routes it to the API layer (which answers through it: a body, or a stream of
// events written in chunked encoding), then reads the next one on the same connection. While a
// call generates, a close or reset of the client aborts it (the disconnect watch), and so does
// request_timeout_s. Every handler runs on the connection's strand.
#pragma once

#include <utility>  // (before Asio: its awaitable.hpp uses std::exchange)

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/api/call.h"
#include "core/api/service.h"
#include "core/http/server.h"

namespace kvrt::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

Clock::duration seconds(double s);

// Method + path -> handler: the table the API layer gives (api::Service::routes), looked up for
// each request; a path that is not there is a 404, one asked with another method a 405 naming
// the methods it takes.
class Router {
 public:
  explicit Router(std::vector<api::Route> routes);

  struct Match {
    const api::Handler* handler = nullptr;  // null: no route
    int status = 200;                        // 404 (no such path) or 405 (not that method)
    std::string allowed;                     // a 405's methods: "POST or GET"
  };
  Match find(boost::beast::http::verb method, const std::string& path) const;

 private:
  struct Entry {
    std::string path;
    boost::beast::http::verb method;
    api::Handler handler;
  };
  std::vector<Entry> entries_;
};

class Session;

// What the listener (server.cc) and every connection share.
struct HttpServer::Impl {
  ServerOptions options;
  api::Service service;
  Router router;
  net::io_context ioc;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  tcp::acceptor acceptor;
  std::vector<std::thread> threads;
  std::atomic<int> connections{0};
  std::atomic<bool> accepting{false};
  // Every open session, to close them at shutdown and to find an idle one past max_connections.
  std::mutex session_mutex;
  std::vector<std::weak_ptr<Session>> sessions;

  Impl(const ServerOptions& o, serve::StepLoop& loop, ModelLimits limits, ServerInfo info);
  void accept();
  // Past max_connections: closes an idle connection to make room, else the one that has spent
  // longest reading its header (a slow client's, or a slowloris'); false when every connection
  // has a whole request header (a request in progress).
  bool make_room();
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, HttpServer::Impl& server);
  ~Session();

  void start();
  void close();
  // Closes the connection if it is idle now (and it is then no longer idle, so no other
  // accept picks it); false when it is not.
  bool close_if_idle();
  // Since when it has been reading a request header (steady clock ticks), 0 when it is not.
  Clock::rep header_since() const { return header_since_.load(); }
  // Closes the connection if it is still reading the header it began at `since`; false when it
  // has finished it meanwhile (its request then goes on).
  bool close_if_reading_header(Clock::rep since);

 private:
  // Writes what the API gave back for this connection's request, in order (call.h's Reply).
  void write(api::Reply reply);
  // The call's way back: its task runs on this connection's strand and its Reply is written.
  api::Post poster();
  void respond(int status, std::string body, const char* content_type, bool retry_after);
  void begin_stream();
  void write_event(const std::string& data);
  void end_stream();

  // What a read waits for, and so which timeout ends it.
  enum class Phase { kIdle, kHeader, kBody };

  void close_now();
  // The phase's timeout: when it fires, the read in flight is cancelled and on_read answers it.
  void arm_read_timer(Phase phase);
  void disarm_read_timer();
  void read();
  // `arm`: the header begins now (else it began at the accept, and its clock runs already).
  void read_header(bool arm);
  void begin_header();
  void read_body();
  void on_read(beast::error_code ec, size_t);
  bool authorized() const;
  void handle();
  // The call generating on this connection, if any, aborted.
  void abort_generation(const std::string& reason);
  void watch_disconnect();
  void rearm_disconnect_watch(uint64_t exchange);
  bool peer_open();
  void send_raw(std::string bytes);
  void write_next();
  void respond_json_body(int status, std::string body);
  void finish_response(bhttp::response<bhttp::string_body> res);
  void after_response();
  void finish_exchange();
  void shutdown_write();

  beast::tcp_stream stream_;
  HttpServer::Impl& server_;
  net::steady_timer timer_;  // the read phase's timeout, then the request's (request_timeout_s)
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  bhttp::request<bhttp::string_body> request_;
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
  bool read_after_writes_ = false;
  std::shared_ptr<api::Call> call_;  // the call generating on this connection, if any
  uint64_t exchange_ = 0;  // counts generations on this connection (watch_disconnect)
  std::string writing_;  // the bytes of the write in flight ("" when none)
  std::string queued_;   // what comes after them
};

}  // namespace kvrt::http
