// The fixture of the tests of kvrt serve's HTTP server on a real socket (127.0.0.1, a free
// port): a server over stories260k or a preset with [server] overrides, a one-request Beast
// client, and the checks after each test that no request is left running, no page held and no
// connection open.
#pragma once

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/client/http_client.h"
#include "core/config/config.h"
#include "core/runtime/runtime.h"
#include "core/api/server_info.h"
#include "core/http/server.h"
#include "core/serve/batch_runner.h"
#include "tests/e2e/stories260k_reference.h"

namespace kvrt::http::test {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using nlohmann::json;
using namespace api;  // NOLINT: the API's names (ModelLimits, request_defaults), as in the server

using stories260k::model_dir;

struct Reply {
  int status = 0;
  std::string body;
  http::fields headers;
  json json_body() const { return json::parse(body, nullptr, false); }
};

// One request on a fresh connection.
inline Reply call(uint16_t port, http::verb verb, const std::string& target,
                  const std::string& body,
                  const std::vector<std::pair<std::string, std::string>>& headers = {}) {
  net::io_context ioc;
  beast::tcp_stream stream(ioc);
  stream.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
  http::request<http::string_body> req{verb, target, 11};
  req.set(http::field::host, "127.0.0.1");
  for (const auto& [k, v] : headers) req.set(k, v);
  req.body() = body;
  req.prepare_payload();
  http::write(stream, req);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(1 << 26);
  beast::error_code ec;
  http::read(stream, buffer, parser, ec);
  Reply r;
  if (ec) return r;
  r.status = parser.get().result_int();
  r.body = parser.get().body();
  r.headers = parser.get().base();
  return r;
}

inline Reply post(uint16_t port, const std::string& target, const json& body) {
  return call(port, http::verb::post, target, body.dump());
}

// The real engine, greedy, except that a batch holding a prompt that starts with `poison`
// fails as an engine error would.
class FaultyExecutor : public serve::BatchRunner {
 public:
  FaultyExecutor(exec::Engine* engine, int32_t poison) : inner_(engine), poison_(poison) {}
  Status run(const sched::ScheduledBatch& batch, std::span<sampling::Sampler* const>,
             std::vector<int32_t>* next) override {
    for (const sched::ScheduledSequence& s : batch.sequences) {
      if (!s.request->tokens.empty() && s.request->tokens[0] == poison_) {
        return Status::Internal("injected fault: the attention plugin returned an error");
      }
    }
    greedy_of_.assign(batch.sequences.size(), &greedy_);
    return inner_.run(batch, greedy_of_, next);
  }

 private:
  sampling::Sampler greedy_{sampling::SamplingParams{}};
  std::vector<sampling::Sampler*> greedy_of_;
  serve::EngineRunner inner_;
  int32_t poison_;
};

class ServerTest : public ::testing::Test {
 protected:
  // A server over stories260k (the real model) or a preset, with [server] overrides.
  // With `poison` >= 0, the engine's step fails for any batch holding a prompt that starts
  // with that id (fault injection); other batches run on the real engine.
  void serve(std::vector<std::string> overrides, size_t max_unfinished = 64, int poison = -1) {
    setenv("KVRT_PLUGIN_PATH", KVRT_PLUGIN_DIR, 1);
    spdlog::set_level(spdlog::level::err);
    overrides.push_back("server.port=0");
    Result<config::Config> cfg = config::load_string("", "<test>", overrides);
    ASSERT_TRUE(cfg.ok()) << cfg.status().message();
    cfg_ = std::make_unique<config::Config>(*cfg);
    registry_ = std::make_unique<plugin::Registry>();
    registry_->set_config_source(
        [this](const std::string& n) { return cfg_->plugin_table("kv", n); });
    Result<runtime::Runtime> rt = runtime::build_runtime(*cfg_, *registry_);
    ASSERT_TRUE(rt.ok()) << rt.status().message();
    rt_ = std::make_unique<runtime::Runtime>(std::move(*rt));
    serve::ServingOptions serving = runtime::serving_options(*cfg_, *rt_, {});
    serving.tokenizer = rt_->tokenizer.get();
    serving.eos_token_ids = rt_->model.eos_token_ids;  // as kvrt serve does
    if (poison >= 0) {
      faulty_ = std::make_unique<FaultyExecutor>(rt_->engine.get(), poison);
      core_ = std::make_unique<serve::ServingCore>(serving, faulty_.get(), nullptr);
    } else {
      core_ = std::make_unique<serve::ServingCore>(serving, rt_->engine.get());
    }
    // max_unfinished requests at once: running ones, then queued ones.
    serve::StepLoopOptions loop_options;
    loop_options.max_running_requests =
        std::min(max_unfinished, static_cast<size_t>(cfg_->scheduler.max_running_requests));
    loop_options.max_queued_requests = max_unfinished - loop_options.max_running_requests;
    loop_ = std::make_unique<serve::StepLoop>(*core_, loop_options);
    // SGLang's keys as kvrt serve gives them (serve.cc adds kvrt's own beside them).
    const RequestDefaults defaults = request_defaults(rt_->generation);
    loop_->describe([this, defaults](const serve::ServingCore& c) {
      return sglang_server_info(*cfg_, c, cfg_->kv.store, "test-model", defaults).dump();
    });
    ServerOptions options = server_options(*cfg_);
    ModelLimits limits;
    limits.tokenizer = rt_->tokenizer.get();
    limits.vocab_size = static_cast<int32_t>(rt_->model.vocab_size);
    limits.context_length = rt_->model.max_position_embeddings;
    limits.max_prompt_bytes = prompt_byte_bound(*rt_->tokenizer, limits.context_length);
    limits.max_sequence_tokens = std::min<int64_t>(
        limits.context_length, static_cast<int64_t>(core_->max_total_num_tokens()));
    limits.defaults = defaults;
    // As kvrt serve does: [server] chat_template, else the model directory's own.
    Result<ChatFormat> chat =
        resolve_chat_format(cfg_->server.chat_template, cfg_->model.path, rt_->tokenizer.get());
    ASSERT_TRUE(chat.ok()) << chat.status().message();
    chat_ = std::move(*chat);
    limits.chat = &chat_;
    ServerInfo info;
    info.model_name = "test-model";
    info.model_info = json{{"model_path", rt_->model_name}}.dump();
    http_ = std::make_unique<HttpServer>(options, *loop_, limits, info);
    loop_->start();
    ASSERT_TRUE(http_->start().ok());
    port_ = http_->port();
  }

  // Nothing left running, no page held, no connection open.
  void TearDown() override {
    if (!http_) return;
    for (int i = 0; i < 200 && (loop_->unfinished() > 0 || http_->open_connections() > 0); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(loop_->unfinished(), 0u);
    EXPECT_EQ(http_->open_connections(), 0);
    const size_t running =
        loop_->call([](serve::ServingCore& c) { return c.scheduler().num_running(); });
    EXPECT_EQ(running, 0u);
    // No page leaked: every request's pages are back (the prefix cache may keep evictable ones).
    const std::string metrics = loop_->call([](serve::ServingCore& c) { return c.prometheus(); });
    EXPECT_NE(metrics.find("\nkvrt:num_used_tokens 0\n"), std::string::npos) << metrics;
    http_->shutdown();
    loop_->stop();
  }

  bool has_model() const { return std::filesystem::exists(model_dir() + "/model.safetensors"); }

  std::unique_ptr<config::Config> cfg_;
  std::unique_ptr<plugin::Registry> registry_;
  std::unique_ptr<runtime::Runtime> rt_;
  ChatFormat chat_;  // the served chat template
  std::unique_ptr<FaultyExecutor> faulty_;
  std::unique_ptr<serve::ServingCore> core_;
  std::unique_ptr<serve::StepLoop> loop_;
  std::unique_ptr<HttpServer> http_;
  uint16_t port_ = 0;
};

inline std::vector<int32_t> ids_of(const json& j) {
  return j.at("output_ids").get<std::vector<int32_t>>();
}

// The "data: {...}" events of a streamed answer, [DONE] excluded (it sets *done).
inline std::vector<json> events_of(const std::string& body, bool* done) {
  std::vector<json> events;
  client::SseParser sse;
  sse.feed(body, [&](std::string_view data) {
    if (data == "[DONE]") {
      *done = true;
    } else {
      events.push_back(json::parse(data));
    }
  });
  return events;
}

}  // namespace kvrt::http::test
