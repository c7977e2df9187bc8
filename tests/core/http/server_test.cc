// kvrt serve's HTTP server on a real socket (127.0.0.1, a free port), spoken to with a Beast
// client: the reference ids over /generate, streaming, batches, every bad input with its status
// and param, timeouts and max_connections, overload, a client that disconnects, abort by rid,
// the trace; after each test no request is left running and no connection open.
// (server_api_test.cc: the APIs' behaviour on the same fixture.)
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <tuple>

#include "core/bench/bench_http.h"
#include "core/bench/workload.h"
#include "core/client/http_client.h"
#include "core/config/config.h"
#include "core/api/server_info.h"
#include "core/runtime/runtime.h"
#include "core/serve/batch_runner.h"
#include "tests/core/http/server_fixture.h"
#include "tests/e2e/stories260k_reference.h"

namespace kvrt::http {
namespace {

using namespace test;  // NOLINT: the fixture's names, as if written here

TEST_F(ServerTest, GenerateGivesTheReferenceIds) {
  if (!has_model()) GTEST_SKIP() << model_dir() << " not found";
  serve({"model.path=\"" + model_dir() + "\""});
  Reply r = post(
      port_, "/generate",
      {{"text", "Once upon a time"},
       {"sampling_params", {{"max_new_tokens", 27}, {"ignore_eos", true}, {"temperature", 0}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.json_body();
  EXPECT_EQ(ids_of(j), stories260k::kExpected);
  EXPECT_EQ(j["meta_info"]["prompt_tokens"], 5);
  EXPECT_EQ(j["meta_info"]["completion_tokens"], 27);
  EXPECT_EQ(j["meta_info"]["finish_reason"]["type"], "length");
  EXPECT_EQ(j["text"].get<std::string>().rfind(", there was a little girl", 0), 0u);
  // The same through input_ids, as a batch of two answered in order.
  Reply batch = post(
      port_, "/generate",
      {{"input_ids", {{1, 403, 407, 261, 378}, {1, 403, 407, 261, 378}}},
       {"sampling_params", {{"max_new_tokens", 27}, {"ignore_eos", true}, {"temperature", 0}}}});
  ASSERT_EQ(batch.status, 200) << batch.body;
  ASSERT_TRUE(batch.json_body().is_array());
  for (const json& one : batch.json_body()) EXPECT_EQ(ids_of(one), stories260k::kExpected);
}

TEST_F(ServerTest, StreamingSendsEveryTokenOnceThenDone) {
  if (!has_model()) GTEST_SKIP() << model_dir() << " not found";
  serve({"model.path=\"" + model_dir() + "\""});
  Reply r = post(
      port_, "/generate",
      {{"text", "Once upon a time"},
       {"stream", true},
       {"sampling_params", {{"max_new_tokens", 27}, {"ignore_eos", true}, {"temperature", 0}}}});
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.headers[http::field::content_type], "text/event-stream");
  bool done = false;
  const std::vector<json> events = events_of(r.body, &done);
  // As SGLang streams: each event has every id so far, one more than the last.
  std::vector<int32_t> ids;
  for (const json& j : events) {
    const std::vector<int32_t> so_far = ids_of(j);
    EXPECT_EQ(so_far.size(), ids.size() + 1);
    EXPECT_TRUE(std::equal(ids.begin(), ids.end(), so_far.begin()));
    ids = so_far;
  }
  ASSERT_FALSE(events.empty());
  const std::string last_text = events.back()["text"];
  EXPECT_TRUE(done);
  EXPECT_GE(events.size(), 27u);
  EXPECT_EQ(ids, stories260k::kExpected);
  EXPECT_EQ(last_text.rfind(", there was a little girl", 0), 0u);
}

TEST_F(ServerTest, StopStringEndsTheTextBeforeIt) {
  if (!has_model()) GTEST_SKIP() << model_dir() << " not found";
  serve({"model.path=\"" + model_dir() + "\""});
  Reply r =
      post(port_, "/generate",
           {{"text", "Once upon a time"},
            {"sampling_params", {{"max_new_tokens", 27}, {"stop", {"girl"}}, {"temperature", 0}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.json_body();
  EXPECT_EQ(j["text"], ", there was a little ");
  EXPECT_EQ(j["meta_info"]["finish_reason"]["type"], "stop");
  EXPECT_EQ(j["meta_info"]["finish_reason"]["matched"], "girl");
}

// A stream never sends part of a stop string: the streamed text, /generate's cumulative events
// and OpenAI's deltas alike, equals the answer without streaming (issue 27).
TEST_F(ServerTest, StreamedTextHoldsBackWhatMayBeAStopString) {
  if (!has_model()) GTEST_SKIP() << model_dir() << " not found";
  serve({"model.path=\"" + model_dir() + "\""});
  const json sp = {{"max_new_tokens", 27}, {"stop", {" girl"}}, {"temperature", 0}};
  Reply plain = post(port_, "/generate", {{"text", "Once upon a time"}, {"sampling_params", sp}});
  ASSERT_EQ(plain.status, 200) << plain.body;
  const std::string want = plain.json_body()["text"];
  EXPECT_EQ(want, ", there was a little");
  Reply r = post(port_, "/generate",
                 {{"text", "Once upon a time"}, {"stream", true}, {"sampling_params", sp}});
  ASSERT_EQ(r.status, 200);
  bool done = false;
  const std::vector<json> events = events_of(r.body, &done);
  ASSERT_FALSE(events.empty());
  for (const json& e : events) {
    const std::string text = e["text"];
    EXPECT_EQ(want.compare(0, text.size(), text), 0) << "sent " << text;
  }
  EXPECT_EQ(events.back()["text"], want);
  Reply c = post(port_, "/v1/completions",
                 {{"prompt", "Once upon a time"},
                  {"max_tokens", 27},
                  {"stop", {" girl"}},
                  {"stream", true},
                  {"temperature", 0}});
  ASSERT_EQ(c.status, 200);
  std::string deltas;
  for (const json& e : events_of(c.body, &done)) {
    deltas += e["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(deltas, want);
}

// HTTP/1.0 cannot read chunked encoding: a stream is answered with the events as they are and
// the connection closed at the end.
TEST_F(ServerTest, Http10StreamIsSentWithoutChunksAndClosed) {
  serve({"model.preset=synth-tiny"});
  net::io_context ioc;
  tcp::socket socket(ioc);
  socket.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_));
  const std::string body = json{{"input_ids", {1, 2, 3}},
                                {"stream", true},
                                {"sampling_params", {{"max_new_tokens", 4}, {"ignore_eos", true}}}}
                               .dump();
  net::write(socket, net::buffer("POST /generate HTTP/1.0\r\nContent-Length: " +
                                 std::to_string(body.size()) + "\r\n\r\n" + body));
  std::string answer;
  beast::error_code ec;
  net::read(socket, net::dynamic_buffer(answer), ec);  // to the server's close
  EXPECT_EQ(ec, net::error::eof) << ec.message();
  EXPECT_EQ(answer.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << answer;
  EXPECT_EQ(answer.find("Transfer-Encoding"), std::string::npos) << answer;
  const std::string events = answer.substr(answer.find("\r\n\r\n") + 4);
  EXPECT_EQ(events.rfind("data: {", 0), 0u) << events;
  bool done = false;
  std::vector<int32_t> ids;
  for (const json& e : events_of(events, &done)) ids = ids_of(e);  // the ids so far
  EXPECT_TRUE(done);
  EXPECT_EQ(ids.size(), 4u);
}

// "Expect: 100-continue" is answered before the client sends its body.
TEST_F(ServerTest, ExpectContinueIsAnswered) {
  serve({"model.preset=synth-tiny"});
  net::io_context ioc;
  tcp::socket socket(ioc);
  socket.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_));
  const std::string body = json{{"input_ids", {1, 2, 3}},
                                {"sampling_params", {{"max_new_tokens", 2}, {"ignore_eos", true}}}}
                               .dump();
  net::write(socket, net::buffer("POST /generate HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                                 "Content-Length: " +
                                 std::to_string(body.size()) + "\r\n\r\n"));
  std::string interim;
  net::read_until(socket, net::dynamic_buffer(interim), "\r\n\r\n");
  EXPECT_EQ(interim, "HTTP/1.1 100 Continue\r\n\r\n");
  net::write(socket, net::buffer(body));
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  http::read(socket, buffer, res);
  EXPECT_EQ(res.result_int(), 200) << res.body();
  EXPECT_EQ(json::parse(res.body())["meta_info"]["completion_tokens"], 2);
}

// Every bad body is a 400 naming the field; the server stays up for the next request.
TEST_F(ServerTest, BadInputIsA400NamingTheField) {
  serve({"model.preset=synth-tiny"});
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{not json", ""},
      {"[1, 2]", ""},
      {R"({"sampling_params": {}})", "text"},
      {R"({"text": "a", "input_ids": [1]})", "input_ids"},
      {R"({"text": ""})", "text"},
      {R"({"input_ids": []})", "input_ids"},
      // The serving core checks the values once and names the field (its message the position).
      {R"({"input_ids": [1, -4]})", "input_ids"},
      {R"({"input_ids": [1, 512]})", "input_ids"},
      {R"({"input_ids": [1, "x"]})", "input_ids[1]"},
      {R"({"input_ids": [1], "sampling_params": {"temperature": -1}})",
       "sampling_params.temperature"},
      {R"({"input_ids": [1], "sampling_params": {"top_p": 0}})", "sampling_params.top_p"},
      {R"({"input_ids": [1], "sampling_params": {"top_p": 1.5}})", "sampling_params.top_p"},
      {R"({"input_ids": [1], "sampling_params": {"top_k": -2}})", "sampling_params.top_k"},
      {R"({"input_ids": [1], "sampling_params": {"max_new_tokens": -1}})",
       "sampling_params.max_new_tokens"},
      {R"({"input_ids": [1], "sampling_params": {"max_new_tokens": 1e12}})",
       "sampling_params.max_new_tokens"},
      {R"({"input_ids": [1], "sampling_params": {"max_new_tokens": 5000}})",
       "sampling_params.max_new_tokens"},
      {R"({"input_ids": [1], "sampling_params": {"stop_token_ids": [9999]}})",
       "sampling_params.stop_token_ids"},
      {R"({"input_ids": [1], "sampling_params": {"min_p": 1.5}})", "sampling_params.min_p"},
      {R"({"input_ids": [1], "sampling_params": {"temprature": 1}})", "sampling_params.temprature"},
      {R"({"input_ids": [1], "stream": "yes"})", "stream"},
      {"{\"text\": \"\xff\xfe\"}", ""},
  };
  for (const auto& [body, param] : cases) {
    Reply r = call(port_, http::verb::post, "/generate", body);
    EXPECT_EQ(r.status, 400) << body << " -> " << r.body;
    const json j = r.json_body();
    ASSERT_TRUE(j.is_object()) << r.body;
    EXPECT_EQ(j["error"]["param"], param.empty() ? json(nullptr) : json(param)) << body;
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
  }
  EXPECT_EQ(post(port_, "/generate",
                 {{"input_ids", {1, 2}}, {"sampling_params", {{"max_new_tokens", 2}}}})
                .status,
            200);
}

TEST_F(ServerTest, UnknownPathWrongMethodLargeBodyAndKey) {
  serve({"model.preset=synth-tiny", "server.max_body_bytes=100", "server.api_key=\"k3y\""});
  const std::vector<std::pair<std::string, std::string>> auth = {{"Authorization", "Bearer k3y"}};
  EXPECT_EQ(call(port_, http::verb::get, "/health", "").status, 401);
  EXPECT_EQ(call(port_, http::verb::get, "/health", "", {{"Authorization", "Bearer nope"}}).status,
            401);
  EXPECT_EQ(call(port_, http::verb::get, "/health", "", auth).status, 200);
  EXPECT_EQ(call(port_, http::verb::get, "/nowhere", "", auth).status, 404);
  EXPECT_EQ(call(port_, http::verb::get, "/generate", "", auth).status, 405);
  EXPECT_EQ(call(port_, http::verb::post, "/generate", std::string(200, ' '), auth).status, 413);
  Reply info = call(port_, http::verb::get, "/get_server_info", "", auth);
  ASSERT_EQ(info.status, 200);
  EXPECT_GT(info.json_body()["max_total_num_tokens"].get<uint64_t>(), 0u);
  Reply metrics = call(port_, http::verb::get, "/metrics", "", auth);
  ASSERT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("kvrt:num_running_reqs 0"), std::string::npos);
  EXPECT_EQ(call(port_, http::verb::get, "/health_generate", "", auth).status, 200);
}

// Beyond the bounded queue a request is answered 503 with Retry-After at once.
TEST_F(ServerTest, OverloadIsA503WithRetryAfter) {
  serve({"model.preset=synth-tiny"}, /*max_unfinished=*/1);
  std::thread busy([&] {
    // Running until aborted below, however slowly the second request arrives (a request of a
    // few hundred tokens can end first on a loaded machine).
    Reply r = post(port_, "/generate",
                   {{"input_ids", {1, 2, 3}},
                    {"rid", "busy"},
                    {"sampling_params", {{"max_new_tokens", 2000}, {"ignore_eos", true}}}});
    EXPECT_EQ(r.status, 200);
  });
  while (loop_->unfinished() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  Reply r = post(port_, "/generate", {{"input_ids", {1, 2}}});
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(r.headers[http::field::retry_after], "1");
  post(port_, "/abort_request", {{"rid", "busy"}});
  busy.join();
}

// A client that goes away mid-stream aborts its request; its pages go back, and its connection
// closes (a reset found by one write is not waited on by the next).
TEST_F(ServerTest, DisconnectAbortsTheRequest) {
  serve({"model.preset=synth-tiny"});
  {
    net::io_context ioc;
    beast::tcp_stream stream(ioc);
    stream.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_));
    http::request<http::string_body> req{http::verb::post, "/generate", 11};
    req.body() = json{{"input_ids", {1, 2, 3}},
                      {"stream", true},
                      {"sampling_params", {{"max_new_tokens", 2000}, {"ignore_eos", true}}}}
                     .dump();
    req.prepare_payload();
    http::write(stream, req);
    char first[64];
    stream.read_some(net::buffer(first));  // the head: the request is running
  }                                        // closed
  for (int i = 0; i < 500 && loop_->unfinished() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(loop_->unfinished(), 0u);
  const uint64_t generated =
      loop_->call([](serve::ServingCore& c) { return c.counters().generated_tokens; });
  EXPECT_LT(generated, 2000u);
}

// python requests (urllib3) writes a request's headers and its body in two sends on a reused
// keep-alive connection: the body not having arrived yet is not the client going away.
TEST_F(ServerTest, KeepAliveHeadersAndBodyInTwoWritesAreNeverAborted) {
  serve({"model.preset=synth-tiny"});
  net::io_context ioc;
  beast::tcp_stream stream(ioc);
  stream.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_));
  stream.socket().set_option(tcp::no_delay(true));
  const std::string body =
      json{{"input_ids", {1, 2, 3}}, {"sampling_params", {{"max_new_tokens", 2}}}}.dump();
  const std::string head =
      "POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\n"
      "Content-Type: application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n";
  beast::flat_buffer buffer;
  int aborted = 0, answered = 0;
#ifdef KVRT_SANITIZED_BUILD
  const int requests = 200;  // ~70 ms a request under ASan
#else
  const int requests = 1000;
#endif
  for (int i = 0; i < requests; ++i) {
    net::write(stream.socket(), net::buffer(head));
    // Gaps of 0 to 63 us: the body lands while the server is busy with the headers, or after.
    std::this_thread::sleep_for(std::chrono::microseconds(i % 64));
    net::write(stream.socket(), net::buffer(body));
    http::response<http::string_body> res;
    beast::error_code ec;
    http::read(stream, buffer, res, ec);
    ASSERT_FALSE(ec) << "request " << i << ": " << ec.message();
    ASSERT_EQ(res.result_int(), 200) << res.body();
    ++answered;
    const json j = json::parse(res.body());
    if (j["meta_info"]["finish_reason"]["type"] == "abort") ++aborted;
  }
  EXPECT_EQ(answered, requests);
  EXPECT_EQ(aborted, 0);
}

// Bytes sent on a raw connection, then everything the server sends until it closes (or 5 s).
std::string raw_exchange(uint16_t port, const std::string& bytes, bool* closed = nullptr) {
  net::io_context ioc;
  tcp::socket socket(ioc);
  socket.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
  if (!bytes.empty()) net::write(socket, net::buffer(bytes));
  timeval limit{5, 0};
  setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  std::string got;
  char chunk[4096];
  for (;;) {
    const ssize_t n = ::recv(socket.native_handle(), chunk, sizeof chunk, 0);
    if (n <= 0) {
      if (closed != nullptr) *closed = n == 0 || errno == ECONNRESET;
      return got;
    }
    got.append(chunk, static_cast<size_t>(n));
  }
}

// A late header or body is answered 408 and closed; a connection that sends nothing, or sits
// idle between requests, is closed without an answer (nginx's header, body and keep-alive
// timeouts).
TEST_F(ServerTest, SlowHeaderOrBodyIs408AndAnIdleConnectionIsClosed) {
  serve({"model.preset=synth-tiny", "server.header_timeout_s=0.3", "server.body_timeout_s=0.3",
         "server.idle_timeout_s=0.3"});
  bool closed = false;
  std::string got = raw_exchange(port_, "GET /health HTTP/1.1\r\nHost: x\r\n", &closed);
  EXPECT_EQ(got.rfind("HTTP/1.1 408", 0), 0u) << got;
  EXPECT_NE(got.find("header_timeout_s"), std::string::npos) << got;
  EXPECT_TRUE(closed);
  got = raw_exchange(
      port_, "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"input", &closed);
  EXPECT_EQ(got.rfind("HTTP/1.1 408", 0), 0u) << got;
  EXPECT_NE(got.find("body_timeout_s"), std::string::npos) << got;
  EXPECT_TRUE(closed);
  got = raw_exchange(port_, "", &closed);  // connects and says nothing
  EXPECT_EQ(got, "");
  EXPECT_TRUE(closed);
  // Keep-alive: answered, then closed once idle.
  got = raw_exchange(port_, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", &closed);
  EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got;
  EXPECT_EQ(got.find("408"), std::string::npos) << got;
  EXPECT_TRUE(closed);
}

// Past max_connections an idle connection makes room for a new one, else the one that has spent
// longest reading its header (so connections trickling their headers, a slowloris, cannot lock
// out a client that sends whole requests); when every connection has a request in progress,
// the new one gets 503 and a close.
TEST_F(ServerTest, PastMaxConnectionsIdleThenSlowestHeaderMakeRoomElseA503) {
  serve({"model.preset=synth-tiny", "server.max_connections=3", "server.header_timeout_s=30",
         "server.body_timeout_s=30", "server.idle_timeout_s=30"});
  net::io_context ioc;
  auto settle = [&](int open) {
    for (int i = 0; i < 400 && http_->open_connections() != open; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  };
  std::vector<tcp::socket> idle;
  for (int i = 0; i < 3; ++i) {
    idle.emplace_back(ioc);
    idle.back().connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_));
  }
  settle(3);
  Reply health = call(port_, http::verb::get, "/health", "");
  EXPECT_EQ(health.status, 200);
  // Three connections in the middle of a header take the idle ones' places.
  std::vector<tcp::socket> slow;
  for (int i = 0; i < 3; ++i) {
    slow.emplace_back(ioc);
    slow.back().connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_));
    net::write(slow.back(), net::buffer(std::string("GET /health HTTP/1.1\r\n")));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  settle(3);
  // A whole request gets its answer; the first slow header is the one closed for it.
  bool closed = false;
  std::string got =
      raw_exchange(port_, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", &closed);
  EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got;
  char byte = 0;
  beast::error_code ec;
  slow[0].read_some(net::buffer(&byte, 1), ec);
  EXPECT_EQ(ec, net::error::eof) << ec.message();
  // Three requests whose headers are whole (their bodies on the way) replace the slow headers;
  // with every connection in a request, a new one is a 503.
  std::vector<tcp::socket> busy;
  for (int i = 0; i < 3; ++i) {
    busy.emplace_back(ioc);
    busy.back().connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_));
    net::write(busy.back(), net::buffer(std::string(
                                "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
                                "{\"input_ids\"")));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  settle(3);
  got = raw_exchange(port_, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", &closed);
  EXPECT_EQ(got.rfind("HTTP/1.1 503", 0), 0u) << got;
  EXPECT_NE(got.find("max_connections"), std::string::npos) << got;
  EXPECT_TRUE(closed);
  busy.clear();
  slow.clear();
  idle.clear();
}

// A text prompt that cannot fit the context is refused by its size, before it is tokenized;
// a batch larger than the queue can ever hold is a 400 naming both limits, and nothing of it
// runs.
TEST_F(ServerTest, WhatCanNeverBeServedIsA400AndNothingOfItRuns) {
  if (!has_model()) GTEST_SKIP() << model_dir() << " not found";
  serve({"model.path=\"" + model_dir() + "\""}, /*max_unfinished=*/4);
  const std::string huge(4 << 20, 'a');
  Reply r = post(port_, "/generate", {{"text", huge}});
  EXPECT_EQ(r.status, 400) << r.body.substr(0, 300);
  EXPECT_EQ(r.json_body()["error"]["param"], "text");
  EXPECT_NE(r.body.find("cannot fit the model's context of 512 tokens"), std::string::npos)
      << r.body.substr(0, 300);
  Reply chat =
      post(port_, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", huge}}}}});
  EXPECT_EQ(chat.status, 400);
  EXPECT_EQ(chat.json_body()["error"]["param"], "messages");
  json batch = json::array();
  for (int i = 0; i < 5; ++i) batch.push_back({1, 403, 407});
  Reply b = post(port_, "/generate", {{"input_ids", batch}});
  EXPECT_EQ(b.status, 400) << b.body;
  EXPECT_NE(b.body.find("5 prompts can never be held at once: max_queued_requests (0) + "
                        "max_running_requests (4) = 4"),
            std::string::npos)
      << b.body;
  EXPECT_EQ(b.headers.find(http::field::retry_after), b.headers.end());
  // One prompt of a batch past the context: the whole batch is refused, naming that prompt.
  Reply one =
      post(port_, "/generate",
           {{"input_ids", {{1, 2}, json::array()}}, {"sampling_params", {{"max_new_tokens", 4}}}});
  EXPECT_EQ(one.status, 400) << one.body;
  const std::string metrics = call(port_, http::verb::get, "/metrics", "").body;
  EXPECT_NE(metrics.find("\nkvrt:prompt_tokens_total 0\n"), std::string::npos) << metrics;
}

// A stop string ends its request as finished, not aborted: /metrics counts it with the
// finished ones, and OpenAI's answer says "stop".
TEST_F(ServerTest, AStopStringFinishIsCountedAsFinished) {
  if (!has_model()) GTEST_SKIP() << model_dir() << " not found";
  serve({"model.path=\"" + model_dir() + "\""});
  Reply r = post(port_, "/v1/completions",
                 {{"prompt", "Once upon a time"},
                  {"max_tokens", 27},
                  {"stop", {" girl"}},
                  {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json_body()["choices"][0]["finish_reason"], "stop");
  const std::string metrics = call(port_, http::verb::get, "/metrics", "").body;
  EXPECT_NE(metrics.find("\nkvrt:num_requests_total 1\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\nkvrt:num_aborted_requests_total 0\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("kvrt:e2e_request_latency_seconds_count 1\n"), std::string::npos)
      << metrics;
}

// OpenAI's finish reasons are "stop" and "length" only: an aborted request is an error object,
// answered 503, or sent as an error event in a stream.
TEST_F(ServerTest, AnAbortedOpenAiRequestIsAnErrorNotAFinishReason) {
  serve({"model.preset=synth-tiny", "server.request_timeout_s=0.05"});
  Reply r = post(port_, "/v1/completions",
                 {{"prompt", {1, 2, 3}}, {"max_tokens", 2000}, {"ignore_eos", true}});
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(r.json_body()["error"]["type"], "request_aborted") << r.body;
  EXPECT_NE(r.body.find("request_timeout_s"), std::string::npos) << r.body;
  Reply s =
      post(port_, "/v1/completions",
           {{"prompt", {1, 2, 3}}, {"max_tokens", 2000}, {"ignore_eos", true}, {"stream", true}});
  ASSERT_EQ(s.status, 200);
  bool done = false;
  const std::vector<json> events = events_of(s.body, &done);
  ASSERT_FALSE(events.empty());
  EXPECT_TRUE(events.back().contains("error")) << events.back().dump();
  for (const json& e : events) {
    if (e.contains("choices")) {
      EXPECT_NE(e["choices"][0]["finish_reason"], "abort");
    }
  }
  EXPECT_TRUE(done);
}

TEST_F(ServerTest, AbortByRid) {
  // synth-bench and 8000 tokens: seconds of decoding, so the abort comes while it runs even on
  // a loaded machine (a request that ends first would leave nothing to abort).
  serve({"model.preset=synth-bench"});
  std::atomic<bool> answered{false};
  std::thread long_one([&] {
    Reply r = post(port_, "/generate",
                   {{"input_ids", {1, 2, 3}},
                    {"rid", "mine"},
                    {"sampling_params", {{"max_new_tokens", 8000}, {"ignore_eos", true}}}});
    answered = true;
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.json_body()["meta_info"]["finish_reason"]["type"], "abort");
    EXPECT_EQ(r.json_body()["meta_info"]["id"], "mine");
  });
  while (loop_->unfinished() == 0 && !answered) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_FALSE(answered) << "the request ended before it could be aborted";
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  Reply r = post(port_, "/abort_request", {{"rid", "mine"}});
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.json_body()["success"], true);
  long_one.join();
}

// OpenAI's completions and chat give what /generate gives for the same prompt, in their shape.
TEST_F(ServerTest, OpenAiCompletionsAndChatMatchGenerate) {
  serve({"model.preset=synth-tiny"});
  const json sp = {{"max_new_tokens", 12}, {"ignore_eos", true}, {"temperature", 0}};
  const std::string native =
      post(port_, "/generate", {{"text", "Once upon"}, {"sampling_params", sp}})
          .json_body()["text"];
  Reply c = post(port_, "/v1/completions",
                 {{"model", "m"},
                  {"prompt", "Once upon"},
                  {"max_tokens", 12},
                  {"temperature", 0},
                  {"ignore_eos", true}});
  ASSERT_EQ(c.status, 200) << c.body;
  json j = c.json_body();
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "m");
  EXPECT_EQ(j["choices"][0]["text"], native);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  EXPECT_EQ(j["usage"]["total_tokens"], j["usage"]["prompt_tokens"].get<int>() + 12);

  // Streamed: the deltas add up to the same text, the last chunk says why it ended.
  Reply s = post(port_, "/v1/completions",
                 {{"prompt", "Once upon"},
                  {"max_tokens", 12},
                  {"stream", true},
                  {"ignore_eos", true},
                  {"temperature", 0}});
  bool done = false;
  std::string text;
  const std::vector<json> events = events_of(s.body, &done);
  for (const json& e : events) text += e["choices"][0]["text"].get<std::string>();
  EXPECT_TRUE(done);
  EXPECT_EQ(text, native);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(events.back()["model"], "test-model");

  // Chat: the messages through the default template, answered as the assistant.
  const json messages = json::array({{{"role", "user"}, {"content", "hi"}}});
  const std::string templated =
      post(port_, "/generate", {{"text", "user: hi\nassistant:"}, {"sampling_params", sp}})
          .json_body()["text"];
  Reply chat =
      post(port_, "/v1/chat/completions",
           {{"messages", messages}, {"max_tokens", 12}, {"ignore_eos", true}, {"temperature", 0}});
  ASSERT_EQ(chat.status, 200) << chat.body;
  j = chat.json_body();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], templated);
  Reply chat_stream = post(port_, "/v1/chat/completions",
                           {{"messages", messages},
                            {"max_tokens", 12},
                            {"stream", true},
                            {"ignore_eos", true},
                            {"temperature", 0}});
  done = false;
  text.clear();
  const std::vector<json> chunks = events_of(chat_stream.body, &done);
  for (const json& e : chunks) text += e["choices"][0]["delta"]["content"].get<std::string>();
  EXPECT_TRUE(done);
  EXPECT_EQ(text, templated);
  ASSERT_FALSE(chunks.empty());
  EXPECT_EQ(chunks.front()["object"], "chat.completion.chunk");
  EXPECT_EQ(chunks.front()["choices"][0]["delta"]["role"], "assistant");

  Reply models = call(port_, http::verb::get, "/v1/models", "");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.json_body()["data"][0]["id"], "test-model");

  // Errors name OpenAI's fields.
  for (const auto& [body, param] : std::vector<std::pair<json, std::string>>{
           {{{"prompt", "a"}, {"max_tokens", -1}}, "max_tokens"},
           {{{"prompt", "a"}, {"temperature", "hot"}}, "temperature"},
           {{{"prompt", "a"}, {"n", 65}}, "n"},
           {{{"prompt", "a"}, {"best_of", "two"}}, "best_of"},
           {{{"max_tokens", 3}}, "prompt"}}) {
    Reply r = post(port_, "/v1/completions", body);
    EXPECT_EQ(r.status, 400) << body.dump();
    EXPECT_EQ(r.json_body()["error"]["param"], param) << r.body;
  }
  Reply no_messages = post(port_, "/v1/chat/completions", {{"max_tokens", 3}});
  EXPECT_EQ(no_messages.status, 400);
  EXPECT_EQ(no_messages.json_body()["error"]["param"], "messages");
}

// record_trace writes what kvrt bench --trace replays: one line per finished request.
TEST_F(ServerTest, RecordTraceWritesAReplayableTrace) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kvrt_trace_" + std::to_string(getpid()) + ".jsonl"))
                               .string();
  std::filesystem::remove(path);
  serve({"model.preset=synth-tiny", "server.record_trace=\"" + path + "\""});
  for (int n : {3, 5}) {
    ASSERT_EQ(post(port_, "/generate",
                   {{"input_ids", {1, 2, 3, 4}},
                    {"sampling_params", {{"max_new_tokens", n}, {"ignore_eos", true}}}})
                  .status,
              200);
  }
  Result<bench::WorkloadSpec> trace = bench::load_trace_jsonl(path);
  ASSERT_TRUE(trace.ok()) << trace.status().message();
  ASSERT_EQ(trace->trace.size(), 2u);
  EXPECT_EQ(trace->trace[0].input_len, 4);
  EXPECT_EQ(trace->trace[0].output_len, 3);
  EXPECT_EQ(trace->trace[1].output_len, 5);
  EXPECT_LE(trace->trace[0].arrival_s, trace->trace[1].arrival_s);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace kvrt::http
