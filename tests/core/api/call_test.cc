// The call apart from any socket: a POST /generate and a streamed /v1/completions through the
// API's route table over stories260k, their Replies recorded as a connection would write them
// (the body, or the stream's head, events and end), and a refused request, answered at once.
#include "core/api/call.h"

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/api/service.h"
#include "core/config/config.h"
#include "core/plugin/registry.h"
#include "core/runtime/runtime.h"
#include "core/serve/serving_core.h"
#include "core/serve/serving_core.h"
#include "tests/e2e/stories260k_reference.h"

namespace kvrt::api {
namespace {

using nlohmann::json;

// A connection of its own: Replies are recorded as the transport would write them (the body,
// or the stream's head, events and end), and posted tasks run one at a time on the test's
// thread (drain), as a connection's strand would run them, their Replies recorded too.
class RecordingConnection : public std::enable_shared_from_this<RecordingConnection> {
 public:
  void write(Reply r) {
    if (r.answer) {
      status = r.answer->status;
      body = std::move(r.answer->body);
      content_type = r.answer->content_type;
      retry_after = r.answer->retry_after;
      ended = true;
      return;
    }
    if (r.begin_stream) streaming = true;
    for (std::string& e : r.events) events.push_back(std::move(e));
    if (r.end_stream) ended = true;
  }
  Post post() {
    // Holds the connection, as a socket's does, until the task has run.
    return [self = shared_from_this()](std::function<Reply()> task) {
      std::lock_guard lock(self->mutex_);
      self->tasks_.push_back(std::move(task));
      self->ready_.notify_one();
    };
  }
  // Runs posted tasks until the exchange has ended (or 30 s pass).
  void drain() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!ended && std::chrono::steady_clock::now() < deadline) {
      std::function<Reply()> task;
      {
        std::unique_lock lock(mutex_);
        ready_.wait_until(lock, deadline, [this] { return !tasks_.empty(); });
        if (tasks_.empty()) continue;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      write(task());
    }
  }

  int status = 0;
  std::string body, content_type;
  bool retry_after = false, streaming = false, ended = false;
  std::vector<std::string> events;

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<Reply()>> tasks_;
};

class CallTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("KVRT_PLUGIN_PATH", KVRT_PLUGIN_DIR, 1);
    spdlog::set_level(spdlog::level::err);
    Result<config::Config> cfg = config::load_string(
        "", "<test>", {"model.path=\"" + stories260k::model_dir() + "\""});
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
    serving.eos_token_ids = rt_->model.eos_token_ids;
    core_ = std::make_unique<serve::ServingCore>(serving, rt_->engine.get());
    serve::StepLoopOptions loop_options;
    loop_options.max_running_requests = 8;
    loop_options.max_queued_requests = 8;
    loop_ = std::make_unique<serve::StepLoop>(*core_, loop_options);
    ModelLimits limits;
    limits.tokenizer = rt_->tokenizer.get();
    limits.vocab_size = static_cast<int32_t>(rt_->model.vocab_size);
    limits.context_length = rt_->model.max_position_embeddings;
    service_ = std::make_unique<Service>(ServiceOptions{}, *loop_, limits,
                                         ServerInfo{"{}", "test-model"});
    ASSERT_TRUE(service_->start().ok());
    loop_->start();
  }
  void TearDown() override {
    if (loop_) loop_->stop();
  }

  // The handler of `path`, as the transport's router finds it, run as the transport runs it:
  // its first Reply written, and its Call (null when answered at once) returned.
  std::shared_ptr<Call> handle(const std::string& method, const std::string& path,
                               const std::string& body, RecordingConnection& out) {
    for (Route& r : service_->routes()) {
      if (r.method == method && r.path == path) {
        Handled h = r.handler(Request{path, body}, out.post());
        out.write(std::move(h.reply));
        return h.call;
      }
    }
    ADD_FAILURE() << "no route " << method << " " << path;
    return nullptr;
  }

  std::unique_ptr<config::Config> cfg_;
  std::unique_ptr<plugin::Registry> registry_;
  std::unique_ptr<runtime::Runtime> rt_;
  std::unique_ptr<serve::ServingCore> core_;
  std::unique_ptr<serve::StepLoop> loop_;
  std::unique_ptr<Service> service_;
};

TEST_F(CallTest, AGenerateCallIsAnsweredWithOneBody) {
  auto out = std::make_shared<RecordingConnection>();
  const std::string body =
      json{{"text", "Once upon a time"},
           {"sampling_params", {{"max_new_tokens", 4}, {"temperature", 0}}}}
          .dump();
  std::shared_ptr<Call> call = handle("POST", "/generate", body, *out);
  ASSERT_NE(call, nullptr);
  out->drain();
  ASSERT_TRUE(out->ended);
  EXPECT_EQ(out->status, 200);
  EXPECT_FALSE(out->streaming);
  const json answer = json::parse(out->body);
  EXPECT_EQ(answer["meta_info"]["completion_tokens"], 4);
  EXPECT_EQ(answer["output_ids"].size(), 4u);
  EXPECT_EQ(call->unfinished(), 0u);
}

TEST_F(CallTest, AStreamedCompletionsCallWritesItsEventsThenDone) {
  auto out = std::make_shared<RecordingConnection>();
  const std::string body =
      json{{"prompt", "Once upon a time"}, {"max_tokens", 5}, {"temperature", 0},
           {"stream", true}}
          .dump();
  ASSERT_NE(handle("POST", "/v1/completions", body, *out), nullptr);
  out->drain();
  ASSERT_TRUE(out->ended);
  EXPECT_TRUE(out->streaming);
  ASSERT_GE(out->events.size(), 2u);
  EXPECT_EQ(out->events.back(), "data: [DONE]\n\n");
  const std::string& last = out->events[out->events.size() - 2];
  ASSERT_EQ(last.rfind("data: ", 0), 0u);
  const json chunk = json::parse(last.substr(6));
  EXPECT_EQ(chunk["choices"][0]["finish_reason"], "length");
}

TEST_F(CallTest, ARefusedRequestIsAnsweredAtOnceAndNothingRuns) {
  auto out = std::make_shared<RecordingConnection>();
  const std::string body = json{{"text", "a"}, {"sampling_params", {{"top_p", 0}}}}.dump();
  EXPECT_EQ(handle("POST", "/generate", body, *out), nullptr);
  ASSERT_TRUE(out->ended);
  EXPECT_EQ(out->status, 400);
  EXPECT_EQ(json::parse(out->body)["error"]["param"], "sampling_params.top_p") << out->body;
  EXPECT_EQ(loop_->unfinished(), 0u);
}

}  // namespace
}  // namespace kvrt::api
