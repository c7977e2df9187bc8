// kvrt's HTTP/1.1 client (Boost.Beast over Asio), for `kvrt bench --url` and the server's load
// test: one thread runs every connection, keep-alive connections are reused, and a streamed
// answer's body reaches the caller as its bytes arrive, so one process holds thousands of open
// streams. Not thread-safe: one thread calls everything, and every callback runs on it, inside
// run_until() or fetch().
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "core/util/status.h"

namespace kvrt::client {

// http://HOST[:PORT][/PREFIX]: where a server listens. https is refused (kvrt serve speaks
// plain HTTP; put a TLS proxy in front of it).
struct Url {
  std::string host;
  uint16_t port = 80;
  std::string prefix;  // "" or "/something", put before every request's path
  std::string text;    // as given
};
Result<Url> parse_url(std::string_view text);

struct Response {
  int status = 0;     // the HTTP status; 0 when no answer came (error says why)
  std::string error;  // a transport failure: refused, reset, timed out
  std::string body;   // the whole body, unless the caller took it as it arrived
  std::string content_type;
  std::string retry_after;  // Retry-After, as sent
};

struct ClientOptions {
  std::string api_key;  // sent as "Authorization: Bearer KEY" when not empty
  // A request fails when its server sends nothing for this long (connecting included).
  double timeout_s = 600;
};

class HttpClient {
 public:
  using Clock = std::chrono::steady_clock;
  using BodyCallback = std::function<void(std::string_view bytes)>;
  using DoneCallback = std::function<void(Response)>;

  // Resolves the URL's host; a host that does not resolve is an error when the first request
  // starts (its Response says so).
  HttpClient(Url url, ClientOptions options = {});
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Starts `method target` (target: a path under the URL's prefix) on an idle keep-alive
  // connection, or a new one. `on_body` (may be empty) hears the body's bytes as they arrive,
  // and the Response's body then stays empty; `on_done` is called exactly once. A request
  // whose reused connection the server had closed is sent again on a fresh one.
  void start(std::string method, std::string target, std::string body, BodyCallback on_body,
             DoneCallback on_done);
  // Runs callbacks until `deadline`, returning earlier only when none is left to wait for.
  void run_until(Clock::time_point deadline);
  // start() and wait: the whole answer.
  Response fetch(std::string method, std::string target, std::string body = "");
  // Opens a keep-alive connection that sends nothing and leaves it idle in the pool (a load
  // test's idle clients); `on_open` hears whether it connected.
  void open_idle(std::function<void(bool connected, const std::string& error)> on_open);

  size_t in_flight() const;
  size_t idle_connections() const;
  const Url& url() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Server-sent events from a byte stream cut anywhere: feed() bytes as they arrive; each complete
// event's data (its "data:" lines joined by '\n') goes to `on_event`.
class SseParser {
 public:
  void feed(std::string_view bytes, const std::function<void(std::string_view data)>& on_event);

 private:
  std::string pending_;
};

// The Prometheus text exposition format's samples: "name{labels} value" lines summed by name
// (labels dropped), comments and unreadable lines skipped.
std::map<std::string, double> parse_prometheus(std::string_view text);

}  // namespace kvrt::client
