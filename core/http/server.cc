// The listener of kvrt serve's HTTP server: binds and accepts, hands each socket to a Session
// (session.h), makes room past max_connections, and runs the network threads.
#include "core/http/server.h"

#include <pthread.h>

#include <utility>

#include "core/http/session.h"

namespace kvrt::http {

namespace {

// The API's own options among the [server] table's.
api::ServiceOptions service_options(const ServerOptions& o) {
  api::ServiceOptions s;
  s.record_trace = o.record_trace;
  s.incremental_streaming_output = o.incremental_streaming_output;
  s.metric_names = o.metric_names;
  return s;
}

}  // namespace

HttpServer::Impl::Impl(const ServerOptions& o, serve::StepLoop& loop, ModelLimits limits,
                       ServerInfo info)
    : options(o), service(service_options(o), loop, limits, std::move(info)),
      router(service.routes()), acceptor(net::make_strand(ioc)) {}

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
            std::to_string(api::error_body({503, "every connection is busy (max_connections)", "",
                                       "server_overloaded"})
                               .size()) +
            "\r\n\r\n" +
            api::error_body({503, "every connection is busy (max_connections)", "",
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
                       ServerInfo info)
    : impl_(std::make_unique<Impl>(options, loop, limits, std::move(info))) {}

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
  if (Status t = s.service.start(); !t.ok()) return t;
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

}  // namespace kvrt::http
