// kvrt serve's APIs on a real socket (the fixture of server_test.cc): seeds and their choices,
// the sampling defaults, /get_server_info and /metrics, chat roles and templates, /tokenize,
// a replayed trace, an engine failure, /flush_cache, and the load test.
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
#include "core/runtime/runtime.h"
#include "core/api/server_info.h"
#include "core/serve/batch_runner.h"
#include "tests/core/http/server_fixture.h"
#include "tests/e2e/stories260k_reference.h"

namespace kvrt::http {
namespace {

using namespace test;  // NOLINT: the fixture's names, as if written here

// A temporary file's path, unique to this process.
std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("kvrt_" + name + "_" + std::to_string(getpid())))
      .string();
}

// An unseeded request draws a fresh seed: two of them are two draws, each recorded in the trace
// with its sampling parameters, and the recorded seed replays its request exactly.
TEST_F(ServerTest, UnseededRequestsDrawFreshSeedsThatTheTraceRecords) {
  const std::string path = temp_path("seed_trace.jsonl");
  std::filesystem::remove(path);
  serve({"model.preset=synth-tiny", "server.record_trace=\"" + path + "\""});
  json sp = {{"max_new_tokens", 8},
             {"ignore_eos", true},
             {"temperature", 0.8},
             {"top_k", 40},
             {"repetition_penalty", 1.2}};
  const json body = {{"input_ids", {1, 2, 3, 4}}, {"sampling_params", sp}};
  const Reply first = post(port_, "/generate", body);
  ASSERT_EQ(first.status, 200) << first.body;
  ASSERT_EQ(post(port_, "/generate", body).status, 200);
  Result<bench::WorkloadSpec> trace = bench::load_trace_jsonl(path);
  ASSERT_TRUE(trace.ok()) << trace.status().message();
  ASSERT_EQ(trace->trace.size(), 2u);
  for (const bench::TraceEntry& e : trace->trace) {
    ASSERT_TRUE(e.sampling.has_value());
    EXPECT_EQ(e.sampling->temperature, 0.8f);
    EXPECT_EQ(e.sampling->top_k, 40);
    EXPECT_EQ(e.sampling->top_p, 1.0f);
    EXPECT_EQ(e.sampling->repetition_penalty, 1.2f);
  }
  EXPECT_NE(trace->trace[0].sampling->seed, trace->trace[1].sampling->seed);
  sp["seed"] = trace->trace[0].sampling->seed;
  const Reply replay =
      post(port_, "/generate", {{"input_ids", {1, 2, 3, 4}}, {"sampling_params", sp}});
  ASSERT_EQ(replay.status, 200) << replay.body;
  EXPECT_EQ(ids_of(replay.json_body()), ids_of(first.json_body()));
  std::filesystem::remove(path);
}

// seed (and SGLang's sampling_seed) reproduce a sampled answer exactly; n > 1 with a seed gives
// n different choices, the first the seed's own, and the same n every time.
TEST_F(ServerTest, ASeedReproducesAndItsChoicesDifferTheSameEveryTime) {
  serve({"model.preset=synth-tiny"});
  auto generate = [&](const char* key) {
    const Reply r =
        post(port_, "/generate",
             {{"input_ids", {1, 2, 3}},
              {"sampling_params",
               {{"max_new_tokens", 12}, {"ignore_eos", true}, {"temperature", 1.0}, {key, 5}}}});
    EXPECT_EQ(r.status, 200) << r.body;
    return r.json_body();
  };
  const json seeded = generate("seed");
  EXPECT_EQ(ids_of(generate("seed")), ids_of(seeded));
  EXPECT_EQ(ids_of(generate("sampling_seed")), ids_of(seeded));
  auto choices = [&] {
    const Reply r = post(port_, "/v1/completions",
                         {{"prompt", {1, 2, 3}},
                          {"max_tokens", 12},
                          {"ignore_eos", true},
                          {"temperature", 1.0},
                          {"seed", 5},
                          {"n", 3}});
    EXPECT_EQ(r.status, 200) << r.body;
    const json answer = r.json_body();
    std::vector<std::string> texts;
    for (const json& c : answer["choices"]) texts.push_back(c["text"]);
    return texts;
  };
  const std::vector<std::string> texts = choices();
  ASSERT_EQ(texts.size(), 3u);
  EXPECT_EQ(texts[0], seeded["text"]);
  EXPECT_NE(texts[0], texts[1]);
  EXPECT_NE(texts[1], texts[2]);
  EXPECT_NE(texts[0], texts[2]);
  EXPECT_EQ(choices(), texts);
}

// A model directory's generation_config.json gives the defaults (do_sample false: greedy; its
// max_new_tokens: every API's length), and /get_server_info says so and names the file.
TEST_F(ServerTest, SamplingDefaultsComeFromTheModelsGenerationConfig) {
  if (!has_model()) GTEST_SKIP() << model_dir() << " not found";
  const std::filesystem::path dir = temp_path("gencfg_model");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.model"}) {
    std::filesystem::create_symlink(std::filesystem::absolute(model_dir() + "/" + f), dir / f);
  }
  std::ofstream(dir / "generation_config.json")
      << R"({"do_sample": false, "temperature": 0.7, "max_new_tokens": 27})";
  serve({"model.path=\"" + dir.string() + "\""});
  const Reply g = post(port_, "/generate",
                       {{"text", "Once upon a time"}, {"sampling_params", {{"ignore_eos", true}}}});
  ASSERT_EQ(g.status, 200) << g.body;
  EXPECT_EQ(ids_of(g.json_body()), stories260k::kExpected);  // greedy, 27 tokens
  const Reply c = post(port_, "/v1/completions", {{"prompt", "Once"}, {"ignore_eos", true}});
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(c.json_body()["usage"]["completion_tokens"], 27);
  const json defaults =
      call(port_, http::verb::get, "/get_server_info", "").json_body()["sampling_defaults"];
  EXPECT_EQ(defaults["source"], (dir / "generation_config.json").string());
  EXPECT_EQ(defaults["temperature"], 0.0);
  EXPECT_EQ(defaults["max_new_tokens"], 27);
  std::filesystem::remove_all(dir);
}

// Without a generation_config.json a request samples at temperature 1, completions stop at 16
// tokens and chat runs to the end of the context, as OpenAI's and vLLM's do.
TEST_F(ServerTest, WithoutAGenerationConfigRequestsSampleAndTakeOpenAisLengths) {
  if (!has_model()) GTEST_SKIP() << model_dir() << " not found";
  serve({"model.path=\"" + model_dir() + "\""});
  const json info = call(port_, http::verb::get, "/get_server_info", "").json_body();
  EXPECT_EQ(info["sampling_defaults"]["temperature"], 1.0) << info.dump();
  EXPECT_NE(info["sampling_defaults"]["source"].get<std::string>().find("no generation_config"),
            std::string::npos);
  const Reply plain = post(port_, "/v1/completions", {{"prompt", "Once"}, {"ignore_eos", true}});
  ASSERT_EQ(plain.status, 200) << plain.body;
  EXPECT_EQ(plain.json_body()["usage"]["completion_tokens"], 16);
  // A long message (about 480 tokens), so the rest of the context is a few dozen tokens: cheap
  // to generate under the sanitizers.
  std::string content;
  for (int i = 0; i < 120; ++i) content += "Hi there. ";
  const Reply chat =
      post(port_, "/v1/chat/completions",
           {{"messages", {{{"role", "user"}, {"content", content}}}}, {"ignore_eos", true}});
  ASSERT_EQ(chat.status, 200) << chat.body;
  const json usage = chat.json_body()["usage"];
  EXPECT_GT(usage["completion_tokens"], 0) << usage.dump();
  EXPECT_EQ(usage["total_tokens"], 512) << usage.dump();  // stories260k's whole context
  EXPECT_EQ(chat.json_body()["choices"][0]["finish_reason"], "length");
}

// A one-token text prompt (Qwen3 has no BOS: "Hi" is one token) is served by /generate and
// completions; an empty one is still a 400.
TEST_F(ServerTest, AOneTokenPromptIsServed) {
  const char* root = std::getenv("KVRT_SOURCE_DIR");
  const std::string dir =
      std::string(root != nullptr ? root : ".") + "/../shared/models/tiny-qwen3";
  if (!std::filesystem::exists(dir + "/model.safetensors")) GTEST_SKIP() << dir << " not found";
  serve({"model.path=\"" + dir + "\""});
  const Reply g =
      post(port_, "/generate", {{"text", "Hi"}, {"sampling_params", {{"max_new_tokens", 2}}}});
  ASSERT_EQ(g.status, 200) << g.body;
  EXPECT_EQ(g.json_body()["meta_info"]["prompt_tokens"], 1);
  const Reply c = post(port_, "/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 2}});
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(c.json_body()["usage"]["prompt_tokens"], 1);
  const Reply empty = post(port_, "/generate", {{"text", ""}});
  EXPECT_EQ(empty.status, 400);
  EXPECT_EQ(empty.json_body()["error"]["param"], "text");
  EXPECT_EQ(post(port_, "/v1/completions", {{"prompt", ""}}).status, 400);
}

// max_new_tokens 0 (/generate) and max_tokens 0 (completions, chat) answer no tokens, finish
// reason length, with the prompt's usage, as SGLang does; the prompt is still prefilled (its
// log-probabilities come back when asked for).
TEST_F(ServerTest, ZeroMaxTokensAnswersNoTokensWithThePromptsUsage) {
  serve({"model.preset=synth-tiny"});
  const Reply g = post(port_, "/generate",
                       {{"input_ids", {1, 2, 3}},
                        {"sampling_params", {{"max_new_tokens", 0}}},
                        {"return_logprob", true},
                        {"logprob_start_len", 0}});
  ASSERT_EQ(g.status, 200) << g.body;
  const json j = g.json_body();
  EXPECT_TRUE(j["output_ids"].empty());
  EXPECT_EQ(j["text"], "");
  EXPECT_EQ(j["meta_info"]["prompt_tokens"], 3);
  EXPECT_EQ(j["meta_info"]["completion_tokens"], 0);
  EXPECT_EQ(j["meta_info"]["finish_reason"], json({{"type", "length"}, {"length", 0}}));
  EXPECT_EQ(j["meta_info"]["input_token_logprobs"].size(), 3u) << j.dump();
  EXPECT_TRUE(j["meta_info"]["output_token_logprobs"].empty());
  const Reply streamed = post(
      port_, "/generate",
      {{"input_ids", {1, 2, 3}}, {"stream", true}, {"sampling_params", {{"max_new_tokens", 0}}}});
  ASSERT_EQ(streamed.status, 200);
  bool done = false;
  const std::vector<json> events = events_of(streamed.body, &done);
  ASSERT_FALSE(events.empty());
  EXPECT_TRUE(done);
  EXPECT_EQ(events.back()["meta_info"]["finish_reason"]["type"], "length");
  EXPECT_TRUE(events.back()["output_ids"].empty());
  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    json body = {{"max_tokens", 0}};
    if (std::string(path) == "/v1/completions") {
      body["prompt"] = {1, 2, 3};
    } else {
      body["messages"] = {{{"role", "user"}, {"content", "hi"}}};
    }
    const Reply r = post(port_, path, body);
    ASSERT_EQ(r.status, 200) << path << ": " << r.body;
    const json answer = r.json_body();
    const json& choice = answer["choices"][0];
    EXPECT_EQ(choice["finish_reason"], "length") << path;
    EXPECT_EQ(choice.contains("text") ? choice["text"] : choice["message"]["content"], "");
    EXPECT_EQ(answer["usage"]["completion_tokens"], 0) << path;
    EXPECT_GT(answer["usage"]["prompt_tokens"].get<int>(), 0) << path;
  }
  EXPECT_EQ(post(port_, "/generate",
                 {{"input_ids", json::array()}, {"sampling_params", {{"max_new_tokens", 0}}}})
                .status,
            400);
}

TEST(ServerInfo, KvCacheDtypeIsSglangsNameForTheStore) {
  EXPECT_EQ(kv_cache_dtype("kv_bf16_paged"), "bf16");
  EXPECT_EQ(kv_cache_dtype("kv_fp8_e4m3"), "fp8_e4m3");
  EXPECT_EQ(kv_cache_dtype("kv_host_tiered"), "kv_host_tiered");
  EXPECT_EQ(kv_cache_dtype("my_store"), "my_store");
}

// /get_server_info and /server_info carry SGLang's top-level keys and internal_states (what
// bench_serving.py reads at the end of every run); /metrics has SGLang's
// time_per_output_token_seconds histogram beside kvrt's name for it.
TEST_F(ServerTest, ServerInfoHasSglangsKeysAndMetricsItsTimePerOutputToken) {
  serve({"model.preset=synth-tiny", "scheduler.chunked_prefill_size=256",
         "scheduler.num_continuous_decode_steps=2", "scheduler.mem_fraction_static=0.8"});
  ASSERT_EQ(post(port_, "/generate",
                 {{"input_ids", {1, 2, 3}},
                  {"sampling_params", {{"max_new_tokens", 4}, {"ignore_eos", true}}}})
                .status,
            200);
  for (const char* path : {"/get_server_info", "/server_info"}) {
    const Reply r = call(port_, http::verb::get, path, "");
    ASSERT_EQ(r.status, 200) << path;
    const json j = r.json_body();
    EXPECT_EQ(j["served_model_name"], "test-model") << path;
    EXPECT_EQ(j["mem_fraction_static"], 0.8);
    EXPECT_EQ(j["chunked_prefill_size"], 256);
    EXPECT_EQ(j["num_continuous_decode_steps"], 2);
    EXPECT_EQ(j["kv_cache_dtype"], "bf16");
    EXPECT_EQ(j["tp_size"], 1);
    EXPECT_EQ(j["page_size"], cfg_->scheduler.page_size);
    EXPECT_EQ(j["max_running_requests"], cfg_->scheduler.max_running_requests);
    EXPECT_EQ(j["context_length"], rt_->model.max_position_embeddings);
    EXPECT_GT(j["max_total_num_tokens"].get<uint64_t>(), 0u);
    ASSERT_TRUE(j["internal_states"].is_array()) << j.dump();
    ASSERT_EQ(j["internal_states"].size(), 1u);
    const json& state = j["internal_states"][0];
    EXPECT_TRUE(state["last_gen_throughput"].is_number()) << state.dump();
    EXPECT_EQ(state["#running-req"], 0);
    EXPECT_EQ(state["#queue-req"], 0);
    EXPECT_TRUE(state.contains("avg_spec_accept_length") &&
                state["avg_spec_accept_length"].is_null());
  }
  const std::string metrics = call(port_, http::verb::get, "/metrics", "").body;
  EXPECT_NE(metrics.find("# TYPE sglang:time_per_output_token_seconds histogram"),
            std::string::npos);
  EXPECT_NE(metrics.find("\nsglang:time_per_output_token_seconds_count{model_name=\"test-model\"} "
                         "1\n"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("\nkvrt:time_per_output_token_seconds_count 1\n"), std::string::npos);
}

// OpenAI's roles pass to the template, developer as system; any other role is a 400 naming
// messages[i].role, not a message left out of the prompt.
TEST_F(ServerTest, AnUnknownChatRoleIsA400AndDeveloperIsSystem) {
  serve({"model.preset=synth-tiny"});
  const Reply wizard = post(
      port_, "/v1/chat/completions",
      {{"messages",
        {{{"role", "user"}, {"content", "hi"}}, {{"role", "wizard"}, {"content", "abracadabra"}}}},
       {"max_tokens", 2}});
  EXPECT_EQ(wizard.status, 400) << wizard.body;
  EXPECT_EQ(wizard.json_body()["error"]["param"], "messages[1].role");
  auto ids = [&](const char* role) {
    const Reply r = post(
        port_, "/tokenize",
        {{"messages",
          {{{"role", role}, {"content", "be brief"}}, {{"role", "user"}, {"content", "hi"}}}}});
    EXPECT_EQ(r.status, 200) << r.body;
    return r.json_body()["tokens"];
  };
  EXPECT_EQ(ids("developer"), ids("system"));
  const Reply developer = post(
      port_, "/v1/chat/completions",
      {{"messages",
        {{{"role", "developer"}, {"content", "be brief"}}, {{"role", "user"}, {"content", "hi"}}}},
       {"max_tokens", 2}});
  EXPECT_EQ(developer.status, 200) << developer.body;
}

// Bytes after the JSON body (a NUL among them) are a 400; a number beyond a double names its
// field.
TEST_F(ServerTest, TrailingBytesAndOutOfRangeNumbersAreA400NamingTheField) {
  serve({"model.preset=synth-tiny"});
  using namespace std::string_literals;
  const Reply nul = call(port_, http::verb::post, "/generate", R"({"input_ids": [1]})"s + '\0');
  EXPECT_EQ(nul.status, 400) << nul.body;
  EXPECT_NE(nul.body.find("NUL"), std::string::npos) << nul.body;
  const Reply huge = call(port_, http::verb::post, "/generate",
                          R"({"input_ids": [1], "sampling_params": {"temperature": 1e309}})");
  EXPECT_EQ(huge.status, 400);
  EXPECT_EQ(huge.json_body()["error"]["param"], "sampling_params.temperature") << huge.body;
  const Reply openai =
      call(port_, http::verb::post, "/v1/completions", R"({"prompt": "a", "temperature": 1e309})");
  EXPECT_EQ(openai.status, 400);
  EXPECT_EQ(openai.json_body()["error"]["param"], "temperature") << openai.body;
}

// A trace recorded with sampled requests replays them with their sampling over HTTP: kvrt bench
// --url sends each request's temperature, top-p, seed and penalties, so the server's own trace of
// the replay records the same.
TEST_F(ServerTest, ARecordedTraceReplaysItsSamplingOverHttp) {
  const std::string path = temp_path("replay_trace.jsonl");
  std::filesystem::remove(path);
  serve({"model.preset=synth-tiny", "server.record_trace=\"" + path + "\""});
  ASSERT_EQ(
      post(port_, "/generate",
           {{"input_ids", {1, 2, 3}},
            {"sampling_params",
             {{"max_new_tokens", 3}, {"ignore_eos", true}, {"temperature", 0.9}, {"top_p", 0.8}}}})
          .status,
      200);
  ASSERT_EQ(post(port_, "/v1/completions",
                 {{"prompt", {4, 5}},
                  {"max_tokens", 2},
                  {"ignore_eos", true},
                  {"seed", 11},
                  {"frequency_penalty", 0.5},
                  {"min_p", 0.1}})
                .status,
            200);
  Result<bench::WorkloadSpec> recorded = bench::load_trace_jsonl(path);
  ASSERT_TRUE(recorded.ok()) << recorded.status().message();
  ASSERT_EQ(recorded->trace.size(), 2u);
  bench::HttpBenchOptions options;
  Result<client::Url> url = client::parse_url("http://127.0.0.1:" + std::to_string(port_));
  ASSERT_TRUE(url.ok());
  options.url = *url;
  options.vocab_size = static_cast<int32_t>(rt_->model.vocab_size);
  options.scrape_interval_s = 0.05;
  Result<bench::BenchReport> report = bench::drive_http(options, *recorded);
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_EQ(report->completed, 2u);
  Result<bench::WorkloadSpec> both = bench::load_trace_jsonl(path);
  ASSERT_TRUE(both.ok()) << both.status().message();
  ASSERT_EQ(both->trace.size(), 4u);
  for (size_t i = 0; i < 2; ++i) {
    const bench::TraceEntry& original = recorded->trace[i];
    // The replay's lines: the same lengths and sampling (the bench keeps the trace's order).
    const bench::TraceEntry* replayed = nullptr;
    for (size_t k = 2; k < 4; ++k) {
      if (both->trace[k].sampling->seed == original.sampling->seed) replayed = &both->trace[k];
    }
    ASSERT_NE(replayed, nullptr) << "seed " << original.sampling->seed << " was not replayed";
    EXPECT_EQ(replayed->input_len, original.input_len);
    EXPECT_EQ(replayed->output_len, original.output_len);
    EXPECT_EQ(replayed->sampling->temperature, original.sampling->temperature);
    EXPECT_EQ(replayed->sampling->top_p, original.sampling->top_p);
    EXPECT_EQ(replayed->sampling->min_p, original.sampling->min_p);
    EXPECT_EQ(replayed->sampling->frequency_penalty, original.sampling->frequency_penalty);
  }
  EXPECT_EQ(recorded->trace[1].sampling->seed, 11u);
  EXPECT_EQ(recorded->trace[1].sampling->frequency_penalty, 0.5f);
  std::filesystem::remove(path);
}

// A failure inside the engine is a 500 naming it for the requests of that batch; a request
// already running is unaffected, and the server goes on serving.
TEST_F(ServerTest, EngineFailureIsA500AndTheOthersGoOn) {
  serve({"model.preset=synth-tiny"}, 64, /*poison=*/7);
  std::thread healthy([&] {
    Reply r = post(port_, "/generate",
                   {{"input_ids", {1, 2, 3}},
                    {"sampling_params", {{"max_new_tokens", 300}, {"ignore_eos", true}}}});
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.json_body()["meta_info"]["finish_reason"]["type"], "length");
    EXPECT_EQ(r.json_body()["meta_info"]["completion_tokens"], 300);
  });
  // The healthy request decodes before the poisoned one arrives.
  for (int i = 0; i < 2000; ++i) {
    const uint64_t generated =
        loop_->call([](serve::ServingCore& c) { return c.counters().generated_tokens; });
    if (generated > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  Reply bad = post(port_, "/generate", {{"input_ids", {7, 2, 3}}});
  EXPECT_EQ(bad.status, 500) << bad.body;
  EXPECT_EQ(bad.json_body()["error"]["type"], "server_error");
  EXPECT_NE(bad.json_body()["error"]["message"].get<std::string>().find("injected fault"),
            std::string::npos)
      << bad.body;
  healthy.join();
  // Still serving.
  Reply after = post(
      port_, "/generate",
      {{"input_ids", {1, 2}}, {"sampling_params", {{"max_new_tokens", 4}, {"ignore_eos", true}}}});
  EXPECT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(after.json_body()["meta_info"]["completion_tokens"], 4);
}

// POST /flush_cache empties the prefix cache when idle and is refused (400) while requests
// run; /metrics' cache_hit_rate counts the prefix a second request found.
TEST_F(ServerTest, FlushCacheAndCacheHitRate) {
  serve({"model.preset=synth-tiny", "scheduler.page_size=4"});
  const json body = {{"input_ids", {1, 2, 3, 4, 5, 6, 7, 8, 9}},
                     {"sampling_params", {{"max_new_tokens", 2}, {"ignore_eos", true}}}};
  ASSERT_EQ(post(port_, "/generate", body).status, 200);
  Reply second = post(port_, "/generate", body);
  ASSERT_EQ(second.status, 200);
  EXPECT_EQ(second.json_body()["meta_info"]["cached_tokens"], 8);
  const std::string metrics = call(port_, http::verb::get, "/metrics", "").body;
  EXPECT_NE(metrics.find("\nkvrt:cache_hit_rate " + std::to_string(8.0 / 18).substr(0, 6)),
            std::string::npos)
      << metrics;

  std::thread busy([&] {
    post(port_, "/generate",
         {{"input_ids", {1, 2, 3}},
          {"sampling_params", {{"max_new_tokens", 200}, {"ignore_eos", true}}}});
  });
  while (loop_->unfinished() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  Reply refused = call(port_, http::verb::post, "/flush_cache", "");
  busy.join();
  EXPECT_EQ(refused.status, 400) << refused.body;
  EXPECT_NE(refused.body.find("not flushed while requests run"), std::string::npos);

  Reply flushed = call(port_, http::verb::post, "/flush_cache", "");
  ASSERT_EQ(flushed.status, 200) << flushed.body;
  EXPECT_GT(flushed.json_body()["flushed_pages"].get<int>(), 0);
  Reply cold = post(port_, "/generate", body);
  EXPECT_EQ(cold.json_body()["meta_info"]["cached_tokens"], 0);
  EXPECT_EQ(call(port_, http::verb::get, "/flush_cache", "").status, 200);  // as SGLang
  Reply put = call(port_, http::verb::put, "/flush_cache", "");
  EXPECT_EQ(put.status, 405);
  EXPECT_NE(put.body.find("/flush_cache takes POST or GET"), std::string::npos) << put.body;
}

// Resident memory of this process, in bytes (VmRSS).
uint64_t resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// The load test (not under TSan: 4,500 sockets in one process): 2,000 idle keep-alive
// connections held open while 256 streaming requests run at once on synth-bench, all through
// the project's async client. Every request gets its whole answer; memory is reported.
class ServerLoadTest : public ServerTest {};

TEST_F(ServerLoadTest, Streams256WithTwoThousandIdleConnections) {
  // Both ends of every connection live in this process.
  size_t idle_target = 2000;
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = files.rlim_max;
  setrlimit(RLIMIT_NOFILE, &files);
  getrlimit(RLIMIT_NOFILE, &files);
  if (files.rlim_cur < 2 * (idle_target + 256) + 200) {
    idle_target = files.rlim_cur > 1000 ? (files.rlim_cur - 1000) / 2 : 0;
    std::printf("open files are limited to %llu: holding %zu idle connections\n",
                static_cast<unsigned long long>(files.rlim_cur), idle_target);
  }
  serve({"model.preset=synth-bench", "server.max_connections=4096",
         "scheduler.max_running_requests=256"},
        /*max_unfinished=*/512);
  const uint64_t rss_before = resident_bytes();
  client::Url url;
  url.host = "127.0.0.1";
  url.port = port_;
  url.text = "http://127.0.0.1:" + std::to_string(port_);
  client::HttpClient client(url);
  size_t opened = 0, failed_open = 0;
  for (size_t i = 0; i < idle_target; ++i) {
    client.open_idle([&](bool ok, const std::string&) { ++(ok ? opened : failed_open); });
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (opened + failed_open < idle_target && std::chrono::steady_clock::now() < deadline) {
    client.run_until(std::chrono::steady_clock::now() + std::chrono::milliseconds(50));
  }
  ASSERT_EQ(opened, idle_target);
  for (int i = 0; i < 200 && http_->open_connections() < static_cast<int>(idle_target); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(http_->open_connections(), static_cast<int>(idle_target));
  // The idle connections are kept aside (open, unused) while the streams run on new ones.
  const size_t kStreams = 256;
  const int kTokens = 32;
  std::vector<int> tokens(kStreams, 0), status(kStreams, 0);
  std::vector<bool> done_event(kStreams, false);
  std::vector<client::SseParser> sse(kStreams);
  size_t finished = 0;
  size_t max_open = 0;
  // A second client: its streams open connections of their own, the idle ones stay idle.
  client::HttpClient streams(url);
  for (size_t i = 0; i < kStreams; ++i) {
    const json body = {{"input_ids", {1, static_cast<int>(2 + i % 100), 3, 4}},
                       {"stream", true},
                       {"sampling_params", {{"max_new_tokens", kTokens}, {"ignore_eos", true}}}};
    streams.start(
        "POST", "/generate", body.dump(),
        [&, i](std::string_view bytes) {
          sse[i].feed(bytes, [&, i](std::string_view data) {
            if (data == "[DONE]") {
              done_event[i] = true;
              return;
            }
            const json j = json::parse(data, nullptr, false);
            if (j.is_object()) tokens[i] = static_cast<int>(j["output_ids"].size());  // so far
          });
        },
        [&, i](client::Response r) {
          status[i] = r.status;
          ++finished;
        });
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (finished < kStreams && std::chrono::steady_clock::now() < end) {
    streams.run_until(std::chrono::steady_clock::now() + std::chrono::milliseconds(20));
    client.run_until(std::chrono::steady_clock::now());
    max_open = std::max(max_open, static_cast<size_t>(http_->open_connections()));
  }
  ASSERT_EQ(finished, kStreams);
  for (size_t i = 0; i < kStreams; ++i) {
    EXPECT_EQ(status[i], 200) << i;
    EXPECT_EQ(tokens[i], kTokens) << i;
    EXPECT_TRUE(done_event[i]) << i;
  }
  EXPECT_EQ(client.idle_connections(), idle_target);  // the idle ones are still open
  const uint64_t rss_peak = resident_bytes();
  std::printf(
      "load: %zu idle keep-alive connections + %zu streams of %d tokens, %zu open at "
      "most; resident memory %.1f MiB before, %.1f MiB after (+%.1f MiB)\n",
      idle_target, kStreams, kTokens, max_open, static_cast<double>(rss_before) / 1048576,
      static_cast<double>(rss_peak) / 1048576,
      (static_cast<double>(rss_peak) - static_cast<double>(rss_before)) / 1048576);
  RecordProperty("resident_mib_added",
                 static_cast<int>((rss_peak - std::min(rss_peak, rss_before)) >> 20));
  // Bounded: a few KiB per connection, not a thread or a big buffer each.
  EXPECT_LT(rss_peak - std::min(rss_peak, rss_before), uint64_t{256} << 20);
}

// A model directory with a tokenizer_config.json chat template: /v1/chat/completions renders
// the conversation with it (its BOS text becoming the BOS id), and /tokenize gives the same ids.
TEST_F(ServerTest, ChatUsesTheModelDirectorysTemplate) {
  if (!has_model()) GTEST_SKIP() << model_dir() << " not found";
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("kvrt_chat_" + std::to_string(getpid()));
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.model"}) {
    fs::copy_file(fs::path(model_dir()) / f, dir / f, fs::copy_options::overwrite_existing);
  }
  {
    std::ofstream(dir / "tokenizer_config.json") << json{
        {"bos_token", {{"content", "<s>"}}},
        {"eos_token", "</s>"},
        {"chat_template",
         "{{ bos_token }}{% for m in messages %}{{ m['role'] | upper }}: "
         "{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}ASSISTANT:"
         "{% endif %}"}}.dump();
  }
  serve({"model.path=\"" + dir.string() + "\""});
  EXPECT_FALSE(chat_.is_default);
  EXPECT_EQ(chat_.bos, "<s>");
  const json messages = json::array({{{"role", "user"}, {"content", "Tell me a story"}}});
  Reply chat = post(port_, "/v1/chat/completions",
                    {{"messages", messages}, {"max_tokens", 5}, {"temperature", 0}});
  ASSERT_EQ(chat.status, 200) << chat.body;
  const std::vector<int32_t> want =
      rt_->tokenizer->encode("USER: Tell me a story\nASSISTANT:", true);
  EXPECT_EQ(chat.json_body()["usage"]["prompt_tokens"], want.size());
  Reply tokens = post(port_, "/tokenize", {{"messages", messages}});
  ASSERT_EQ(tokens.status, 200) << tokens.body;
  EXPECT_EQ(tokens.json_body()["tokens"].get<std::vector<int32_t>>(), want);
  // The same prompt through /generate's input_ids gives the same answer.
  Reply gen =
      post(port_, "/generate",
           {{"input_ids", want}, {"sampling_params", {{"max_new_tokens", 5}, {"temperature", 0}}}});
  ASSERT_EQ(gen.status, 200);
  EXPECT_EQ(chat.json_body()["choices"][0]["message"]["content"], gen.json_body()["text"]);
  fs::remove_all(dir);
}

// A template kvrt cannot render stops the server at start-up, naming the file, unless
// [server] chat_template says "default" or names a file.
TEST(ChatFormat, AnUnrenderableTemplateIsRefusedUnlessOverridden) {
  namespace fs = std::filesystem;
  const fs::path bad = fs::temp_directory_path() / ("kvrt_chat_bad_" + std::to_string(getpid()));
  fs::create_directories(bad);
  std::ofstream(bad / "chat_template.jinja") << "{% include 'other.jinja' %}";
  Result<ChatFormat> refused = resolve_chat_format("", bad.string(), nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("chat_template.jinja"), std::string::npos)
      << refused.status().message();
  EXPECT_NE(refused.status().message().find("[server] chat_template"), std::string::npos)
      << refused.status().message();
  Result<ChatFormat> fallback = resolve_chat_format("default", bad.string(), nullptr);
  ASSERT_TRUE(fallback.ok()) << fallback.status().message();
  EXPECT_TRUE(fallback->is_default);
  std::ofstream(bad / "good.jinja")
      << "{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}";
  Result<ChatFormat> file =
      resolve_chat_format((bad / "good.jinja").string(), bad.string(), nullptr);
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_FALSE(file->is_default);
  Result<std::string> text = render_chat(*file, {{"user", "hi"}}, true);
  ASSERT_TRUE(text.ok()) << text.status().message();
  EXPECT_EQ(*text, "[user] hi");
  // A directory without a template: the default, said so.
  Result<ChatFormat> none = resolve_chat_format("", model_dir(), nullptr);
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_TRUE(none->is_default);
  EXPECT_NE(none->description.find("ships no chat template"), std::string::npos);
  fs::remove_all(bad);
}

// POST /tokenize and /detokenize in vLLM's shape, against the tokenizer itself.
TEST_F(ServerTest, TokenizeAndDetokenizeAnswerAsTheTokenizer) {
  if (!has_model()) GTEST_SKIP() << model_dir() << " not found";
  serve({"model.path=\"" + model_dir() + "\""});
  const text::Tokenizer& tok = *rt_->tokenizer;
  Reply r = post(port_, "/tokenize", {{"model", "test-model"}, {"prompt", "Once upon a time"}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json_body()["tokens"].get<std::vector<int32_t>>(),
            tok.encode("Once upon a time", true));
  EXPECT_EQ(r.json_body()["count"], 5);
  EXPECT_EQ(r.json_body()["max_model_len"], rt_->model.max_position_embeddings);
  Reply plain = post(
      port_, "/tokenize",
      {{"prompt", "Once upon a time"}, {"add_special_tokens", false}, {"return_token_strs", true}});
  ASSERT_EQ(plain.status, 200) << plain.body;
  EXPECT_EQ(plain.json_body()["tokens"].get<std::vector<int32_t>>(),
            tok.encode("Once upon a time", false));
  EXPECT_EQ(plain.json_body()["token_strs"][0],
            tok.piece(tok.encode("Once upon a time", false)[0]));
  // stories260k ships no template: the default's lines, with BOS.
  Reply chat = post(
      port_, "/tokenize",
      {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"add_generation_prompt", false}});
  ASSERT_EQ(chat.status, 200) << chat.body;
  EXPECT_EQ(chat.json_body()["tokens"].get<std::vector<int32_t>>(), tok.encode("user: hi\n", true));
  const std::vector<int32_t> ids = {1, 403, 407, 261, 378};
  Reply text = post(port_, "/detokenize", {{"tokens", ids}});
  ASSERT_EQ(text.status, 200) << text.body;
  text::DecodeOptions keep;
  keep.skip_special_tokens = false;
  EXPECT_EQ(text.json_body()["prompt"], tok.decode(ids, keep));
  // Bad bodies name the field.
  for (const auto& [target, body, param] : std::vector<std::tuple<std::string, json, std::string>>{
           {"/tokenize", {{"prompt", "x"}, {"temperature", 1}}, "temperature"},
           {"/tokenize", {{"prompt", 3}}, "prompt"},
           {"/tokenize", {{"prompt", "x"}, {"messages", json::array()}}, "prompt"},
           {"/tokenize", {{"prompt", "x"}, {"add_special_tokens", "yes"}}, "add_special_tokens"},
           {"/tokenize", {{"messages", json::array()}}, "messages"},
           {"/detokenize", {{"tokens", {1, 1 << 20}}}, "tokens[1]"},
           {"/detokenize", json::object(), "tokens"}}) {
    Reply e = post(port_, target, body);
    EXPECT_EQ(e.status, 400) << target << " " << body.dump();
    EXPECT_EQ(e.json_body()["error"]["param"], param) << e.body;
  }
}

// tiny-qwen3 (a real Qwen3 directory: tokenizer.json, its own chat template): chat renders with
// the model's template, and the greedy answer decodes as the reference (transformers.js's
// tokenizer, @lenml/tokenizers 3.7) decodes issue 26's reference continuation.
TEST_F(ServerTest, ChatOnTinyQwen3UsesItsOwnTemplate) {
  const char* root = std::getenv("KVRT_SOURCE_DIR");
  const std::string dir =
      std::string(root != nullptr ? root : ".") + "/../shared/models/tiny-qwen3";
  if (!std::filesystem::exists(dir + "/model.safetensors")) GTEST_SKIP() << dir << " not found";
  serve({"model.path=\"" + dir + "\""});
  EXPECT_EQ(chat_.description, dir + "/tokenizer_config.json (chat_template)");
  const json messages = json::array({{{"role", "user"}, {"content", "Hello! Who are you?"}}});
  const std::vector<int32_t> prompt = {151644, 872, 198,    9707, 0,      10479, 525,
                                       498,    30,  151645, 198,  151644, 77091, 198};
  Reply tokens = post(port_, "/tokenize", {{"messages", messages}});
  ASSERT_EQ(tokens.status, 200) << tokens.body;
  EXPECT_EQ(tokens.json_body()["tokens"].get<std::vector<int32_t>>(), prompt);
  Reply chat = post(port_, "/v1/chat/completions",
                    {{"messages", messages}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_EQ(chat.status, 200) << chat.body;
  EXPECT_EQ(chat.json_body()["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(chat.json_body()["choices"][0]["message"]["content"],
            "\xE5\xB6\x9D\xE4\xB8\x8D\xE8\x87\xB3\xE4\xBA\x8E\xEF\xB9\xBB_CREATE climates Myth "
            "planes BATCH");
  Reply text = post(port_, "/detokenize", {{"tokens", {151644, 872, 198, 9707}}});
  ASSERT_EQ(text.status, 200) << text.body;
  EXPECT_EQ(text.json_body()["prompt"], "<|im_start|>user\nHello");
}

}  // namespace
}  // namespace kvrt::http
