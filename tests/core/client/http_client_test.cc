// The client's pure parts: --url's forms and refusals, server-sent events cut at every byte,
// and Prometheus text as kvrt, SGLang and vLLM write it.
#include "core/client/http_client.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvrt::client {
namespace {

TEST(ParseUrl, HostPortAndPrefix) {
  Result<Url> u = parse_url("http://127.0.0.1:30000");
  ASSERT_TRUE(u.ok()) << u.status().message();
  EXPECT_EQ(u->host, "127.0.0.1");
  EXPECT_EQ(u->port, 30000);
  EXPECT_EQ(u->prefix, "");
  u = parse_url("http://localhost/api/");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->host, "localhost");
  EXPECT_EQ(u->port, 80);
  EXPECT_EQ(u->prefix, "/api");
  u = parse_url("http://[::1]:8000");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->port, 8000);
}

TEST(ParseUrl, RefusesWhatItCannotSpeak) {
  for (const char* bad : {"https://a:1", "ftp://a", "127.0.0.1:30000", "http://", "http://a:0",
                          "http://a:70000", "http://a:x1", "http://:80"}) {
    Result<Url> u = parse_url(bad);
    EXPECT_FALSE(u.ok()) << bad;
    if (!u.ok()) {
      EXPECT_NE(u.status().message().find(bad), std::string::npos);
    }
  }
}

TEST(SseParser, EventsCutAtEveryByte) {
  const std::string stream =
      "data: {\"a\":1}\n\ndata: {\"b\":2}\r\n\r\n: a comment\ndata: x\ndata: y\n\ndata: [DONE]\n\n";
  const std::vector<std::string> want = {"{\"a\":1}", "{\"b\":2}", "x\ny", "[DONE]"};
  for (size_t cut = 1; cut < stream.size(); ++cut) {
    SseParser p;
    std::vector<std::string> got;
    auto on = [&](std::string_view d) { got.emplace_back(d); };
    p.feed(std::string_view(stream).substr(0, cut), on);
    p.feed(std::string_view(stream).substr(cut), on);
    EXPECT_EQ(got, want) << "cut at " << cut;
  }
}

TEST(ParsePrometheus, SamplesByNameLabelsSummed) {
  const std::string text =
      "# HELP kvrt:num_running_reqs The number of running requests.\n"
      "# TYPE kvrt:num_running_reqs gauge\n"
      "kvrt:num_running_reqs 3\n"
      "sglang:token_usage{model_name=\"m\"} 0.25\n"
      "vllm:num_requests_running{engine=\"0\"} 2\n"
      "vllm:num_requests_running{engine=\"1\"} 5 1700000000\n"
      "kvrt:ttft_bucket{le=\"+Inf\"} 7\n"
      "broken line\n"
      "kvrt:bad notanumber\n";
  const std::map<std::string, double> m = parse_prometheus(text);
  EXPECT_EQ(m.at("kvrt:num_running_reqs"), 3);
  EXPECT_EQ(m.at("sglang:token_usage"), 0.25);
  EXPECT_EQ(m.at("vllm:num_requests_running"), 7);
  EXPECT_EQ(m.at("kvrt:ttft_bucket"), 7);
  EXPECT_EQ(m.count("broken"), 0u);
  EXPECT_EQ(m.count("kvrt:bad"), 0u);
}

// A server that is not there: the request ends once with the reason, no answer.
TEST(HttpClient, RefusedConnectionEndsTheRequestWithTheReason) {
  Result<Url> u = parse_url("http://127.0.0.1:1");
  ASSERT_TRUE(u.ok());
  HttpClient c(*u);
  Response r = c.fetch("GET", "/health");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.error.find("cannot connect to 127.0.0.1:1"), std::string::npos) << r.error;
  EXPECT_EQ(c.in_flight(), 0u);
}

}  // namespace
}  // namespace kvrt::client
