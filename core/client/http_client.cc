#include "core/client/http_client.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

namespace kvrt::client {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

Result<Url> parse_url(std::string_view text) {
  Url url;
  url.text = std::string(text);
  const std::string_view scheme = "http://";
  if (text.substr(0, 8) == "https://") {
    return Status::InvalidArgument("--url " + url.text +
                                   ": https is not supported (kvrt serve speaks plain HTTP)");
  }
  if (text.substr(0, scheme.size()) != scheme) {
    return Status::InvalidArgument("--url " + url.text + ": expected http://HOST[:PORT][/PATH]");
  }
  std::string_view rest = text.substr(scheme.size());
  const size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    url.prefix = std::string(rest.substr(slash));
    while (!url.prefix.empty() && url.prefix.back() == '/') url.prefix.pop_back();
  }
  // HOST:PORT, or [IPv6]:PORT.
  const size_t bracket = authority.rfind(']');
  const size_t colon = authority.rfind(':');
  if (colon != std::string_view::npos && (bracket == std::string_view::npos || colon > bracket)) {
    const std::string_view port = authority.substr(colon + 1);
    int value = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (ec != std::errc() || end != port.data() + port.size() || value < 1 || value > 65535) {
      return Status::InvalidArgument("--url " + url.text + ": the port '" + std::string(port) +
                                     "' is not a number in [1, 65535]");
    }
    url.port = static_cast<uint16_t>(value);
    authority = authority.substr(0, colon);
  }
  if (authority.size() >= 2 && authority.front() == '[' && authority.back() == ']') {
    authority = authority.substr(1, authority.size() - 2);
  }
  if (authority.empty()) return Status::InvalidArgument("--url " + url.text + ": no host");
  url.host = std::string(authority);
  return url;
}

namespace {

// One TCP connection; it carries one exchange at a time.
struct Connection {
  explicit Connection(net::io_context& ioc) : stream(ioc) {}
  beast::tcp_stream stream;
  beast::flat_buffer buffer;
  bool used = false;  // has carried an exchange (a server may have closed it since)
};

}  // namespace

struct HttpClient::Impl {
  Impl(Url u, ClientOptions o)
      : url(std::move(u)), options(o), work(net::make_work_guard(ioc)) {}

  // One request, from start() to on_done.
  struct Call {
    std::string method, target, body;
    BodyCallback on_body;
    DoneCallback on_done;
    bool retried = false;
    bool got_bytes = false;
    std::shared_ptr<Connection> conn;
    http::request<http::string_body> request;
    std::optional<http::response_parser<http::buffer_body>> parser;
    Response response;
    char chunk[16384];
  };
  using CallPtr = std::shared_ptr<Call>;

  Url url;
  ClientOptions options;
  net::io_context ioc;
  net::executor_work_guard<net::io_context::executor_type> work;
  std::optional<tcp::resolver::results_type> endpoints;
  std::string resolve_error;
  std::vector<std::shared_ptr<Connection>> idle;
  size_t in_flight = 0;

  std::chrono::steady_clock::duration timeout() const {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(options.timeout_s));
  }

  bool resolve() {
    if (endpoints) return true;
    if (!resolve_error.empty()) return false;
    tcp::resolver resolver(ioc);
    beast::error_code ec;
    auto found = resolver.resolve(url.host, std::to_string(url.port), ec);
    if (ec) {
      resolve_error = "cannot resolve " + url.host + ": " + ec.message();
      return false;
    }
    endpoints = std::move(found);
    return true;
  }

  void connect(std::shared_ptr<Connection> conn, std::function<void(beast::error_code)> then) {
    if (!resolve()) {
      net::post(ioc, [then] { then(net::error::host_not_found); });
      return;
    }
    conn->stream.expires_after(timeout());
    conn->stream.async_connect(*endpoints,
                               [conn, then](beast::error_code ec, const tcp::endpoint&) {
                                 // Requests are sent whole at once: no need to wait on Nagle.
                                 beast::error_code ignored;
                                 if (!ec) conn->stream.socket().set_option(tcp::no_delay(true),
                                                                           ignored);
                                 then(ec);
                               });
  }

  void start(CallPtr call) {
    if (!idle.empty()) {
      call->conn = std::move(idle.back());
      idle.pop_back();
      return send(call);
    }
    call->conn = std::make_shared<Connection>(ioc);
    connect(call->conn, [this, call](beast::error_code ec) {
      if (ec) {
        return fail(call, "cannot connect to " + url.host + ":" + std::to_string(url.port) +
                              ": " + (resolve_error.empty() ? ec.message() : resolve_error));
      }
      send(call);
    });
  }

  void send(CallPtr call) {
    http::request<http::string_body>& req = call->request;
    req = {};
    req.method(http::string_to_verb(call->method));
    req.target(url.prefix + call->target);
    req.version(11);
    req.set(http::field::host, url.host + ":" + std::to_string(url.port));
    req.set(http::field::user_agent, "kvrt-bench");
    if (!options.api_key.empty()) req.set(http::field::authorization, "Bearer " + options.api_key);
    if (!call->body.empty()) req.set(http::field::content_type, "application/json");
    req.keep_alive(true);
    req.body() = call->body;
    req.prepare_payload();
    call->conn->stream.expires_after(timeout());
    http::async_write(call->conn->stream, req, [this, call](beast::error_code ec, size_t) {
      if (ec) return transport_error(call, ec);
      call->parser.emplace();
      call->parser->body_limit(std::numeric_limits<uint64_t>::max());
      http::async_read_header(call->conn->stream, call->conn->buffer, *call->parser,
                              [this, call](beast::error_code e, size_t) {
                                if (e) return transport_error(call, e);
                                call->got_bytes = true;
                                read_body(call);
                              });
    });
  }

  void read_body(CallPtr call) {
    if (call->parser->is_done()) return finish(call);
    call->parser->get().body().data = call->chunk;
    call->parser->get().body().size = sizeof call->chunk;
    call->conn->stream.expires_after(timeout());
    http::async_read_some(call->conn->stream, call->conn->buffer, *call->parser,
                          [this, call](beast::error_code ec, size_t) {
                            if (ec == http::error::need_buffer) ec = {};
                            if (ec) return transport_error(call, ec);
                            const size_t n = sizeof call->chunk - call->parser->get().body().size;
                            if (n > 0) {
                              const std::string_view bytes(call->chunk, n);
                              if (call->on_body) {
                                call->on_body(bytes);
                              } else {
                                call->response.body.append(bytes);
                              }
                            }
                            read_body(call);
                          });
  }

  // A reused keep-alive connection the server had already closed fails before any byte of
  // the answer: the request is sent once more on a fresh connection.
  void transport_error(CallPtr call, beast::error_code ec) {
    if (call->conn->used && !call->got_bytes && !call->retried) {
      call->retried = true;
      close(*call->conn);
      call->conn = std::make_shared<Connection>(ioc);
      connect(call->conn, [this, call](beast::error_code e) {
        if (e) return transport_error(call, e);
        send(call);
      });
      return;
    }
    close(*call->conn);
    fail(call, ec == beast::error::timeout
                   ? "no answer for " + std::to_string(options.timeout_s) + " s"
                   : ec.message());
  }

  void fail(CallPtr call, std::string error) {
    call->response.status = 0;
    call->response.error = std::move(error);
    done(call);
  }

  void finish(CallPtr call) {
    auto& res = call->parser->get();
    call->response.status = static_cast<int>(res.result_int());
    call->response.content_type = std::string(res[http::field::content_type]);
    call->response.retry_after = std::string(res[http::field::retry_after]);
    call->conn->used = true;
    if (res.keep_alive()) {
      call->conn->stream.expires_never();
      idle.push_back(std::move(call->conn));
    } else {
      close(*call->conn);
    }
    done(call);
  }

  void done(CallPtr call) {
    --in_flight;
    call->conn.reset();
    DoneCallback cb = std::move(call->on_done);
    if (cb) cb(std::move(call->response));
  }

  static void close(Connection& conn) {
    beast::error_code ec;
    conn.stream.socket().shutdown(tcp::socket::shutdown_both, ec);
    conn.stream.close();
  }
};

HttpClient::HttpClient(Url url, ClientOptions options)
    : impl_(std::make_unique<Impl>(std::move(url), options)) {}

HttpClient::~HttpClient() {
  for (auto& conn : impl_->idle) Impl::close(*conn);
  impl_->idle.clear();
  impl_->work.reset();
  impl_->ioc.stop();
}

void HttpClient::start(std::string method, std::string target, std::string body,
                       BodyCallback on_body, DoneCallback on_done) {
  auto call = std::make_shared<Impl::Call>();
  call->method = std::move(method);
  call->target = std::move(target);
  call->body = std::move(body);
  call->on_body = std::move(on_body);
  call->on_done = std::move(on_done);
  ++impl_->in_flight;
  impl_->start(std::move(call));
}

void HttpClient::run_until(Clock::time_point deadline) {
  if (impl_->ioc.stopped()) impl_->ioc.restart();
  // A deadline already past runs what is ready (run_one_until would run nothing).
  if (Clock::now() >= deadline) {
    impl_->ioc.poll();
    return;
  }
  // One handler (waiting for it until the deadline), then every other one that is ready.
  if (impl_->ioc.run_one_until(deadline) > 0) impl_->ioc.poll();
}

Response HttpClient::fetch(std::string method, std::string target, std::string body) {
  std::optional<Response> answer;
  start(std::move(method), std::move(target), std::move(body), nullptr,
        [&answer](Response r) { answer = std::move(r); });
  while (!answer) run_until(Clock::now() + std::chrono::seconds(1));
  return std::move(*answer);
}

void HttpClient::open_idle(std::function<void(bool, const std::string&)> on_open) {
  auto conn = std::make_shared<Connection>(impl_->ioc);
  ++impl_->in_flight;
  impl_->connect(conn, [this, conn, on_open](beast::error_code ec) {
    --impl_->in_flight;
    if (ec) return on_open(false, ec.message());
    conn->stream.expires_never();
    impl_->idle.push_back(conn);
    on_open(true, "");
  });
}

size_t HttpClient::in_flight() const { return impl_->in_flight; }
size_t HttpClient::idle_connections() const { return impl_->idle.size(); }
const Url& HttpClient::url() const { return impl_->url; }

void SseParser::feed(std::string_view bytes,
                     const std::function<void(std::string_view)>& on_event) {
  pending_.append(bytes);
  size_t begin = 0;
  while (true) {
    // An event ends at a blank line ("\n\n"; "\r\n\r\n" from servers that send CRLF).
    size_t end = pending_.find("\n\n", begin);
    size_t sep = 2;
    const size_t crlf = pending_.find("\r\n\r\n", begin);
    if (crlf != std::string::npos && (end == std::string::npos || crlf < end)) {
      end = crlf;
      sep = 4;
    }
    if (end == std::string::npos) break;
    std::string data;
    std::string_view event(pending_.data() + begin, end - begin);
    while (!event.empty()) {
      const size_t nl = event.find('\n');
      std::string_view line = event.substr(0, nl);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.substr(0, 5) == "data:") {
        line.remove_prefix(5);
        if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
        if (!data.empty()) data += '\n';
        data.append(line);
      }
      if (nl == std::string_view::npos) break;
      event.remove_prefix(nl + 1);
    }
    begin = end + sep;
    on_event(data);
  }
  pending_.erase(0, begin);
}

std::map<std::string, double> parse_prometheus(std::string_view text) {
  std::map<std::string, double> out;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    if (line.empty() || line.front() == '#') continue;
    size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string_view::npos) continue;
    const std::string name(line.substr(0, name_end));
    size_t value_at = name_end;
    if (line[name_end] == '{') {
      const size_t close = line.find('}', name_end);
      if (close == std::string_view::npos) continue;
      value_at = close + 1;
    }
    std::string_view value = line.substr(value_at);
    while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    value = value.substr(0, value.find(' '));  // a timestamp may follow
    double v = 0;
    if (value == "+Inf") {
      v = std::numeric_limits<double>::infinity();
    } else if (value == "-Inf") {
      v = -std::numeric_limits<double>::infinity();
    } else {
      auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
      if (ec != std::errc() || end != value.data() + value.size()) continue;
    }
    out[name] += v;
  }
  return out;
}

}  // namespace kvrt::client
