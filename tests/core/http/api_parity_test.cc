// What SGLang's and OpenAI's clients send and expect, against kvrt serve on a real socket: the
// fields they send with a "nothing" value accepted and those asking for what kvrt does not do
// refused by name, every OpenAI prompt shape, chat content parts, stream_options.include_usage,
// no_stop_trim, SGLang's cumulative streams (and the incremental opt-in), SGLang's endpoint
// names and shapes, and the metrics under SGLang's names.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tests/core/http/server_fixture.h"

namespace kvrt::http {
namespace {

using namespace test;  // NOLINT: the fixture's names, as if written here

class ApiParityTest : public ServerTest {};

// The param a 400 names, and its message.
std::pair<std::string, std::string> refused(const Reply& r) {
  const json j = r.json_body();
  if (r.status != 400 || !j.contains("error"))
    return {"<status " + std::to_string(r.status) + ">", r.body};
  const json& e = j["error"];
  return {e["param"].is_string() ? e["param"].get<std::string>() : "", e["message"]};
}

TEST_F(ApiParityTest, NoOpFieldsAreAcceptedAndWhatCannotBeHonouredIsRefusedByName) {
  serve({"model.preset=synth-tiny"});
  const json sp = {{"max_new_tokens", 2}, {"ignore_eos", true}};
  // SGLang's bench_serving sends these on every /generate.
  Reply ok = post(port_, "/generate",
                  {{"input_ids", {1, 2, 3}},
                   {"sampling_params", sp},
                   {"lora_path", nullptr},
                   {"return_hidden_states", false},
                   {"image_data", nullptr},
                   {"priority", 3},
                   {"return_logprob", false},
                   {"logprob_start_len", -1},
                   {"modalities", json::array()}});
  EXPECT_EQ(ok.status, 200) << ok.body;
  Reply openai = post(port_, "/v1/completions",
                      {{"prompt", "Once"},
                       {"max_tokens", 2},
                       {"best_of", 1},
                       {"user", "u-1"},
                       {"response_format", {{"type", "text"}}},
                       {"logprobs", nullptr},
                       {"priority", 0},
                       {"ignore_eos", true}});
  EXPECT_EQ(openai.status, 200) << openai.body;
  Reply chat = post(port_, "/v1/chat/completions",
                    {{"messages", {{{"role", "user"}, {"content", "hi"}, {"name", "ann"}}}},
                     {"tools", json::array()},
                     {"tool_choice", "none"},
                     {"max_tokens", 2},
                     {"logprobs", false},
                     {"response_format", {{"type", "text"}}}});
  EXPECT_EQ(chat.status, 200) << chat.body;

  struct Case {
    const char* path;
    json body;
    const char* param;
    const char* words;  // in the message
  };
  const std::vector<Case> cases = {
      {"/generate", {{"input_ids", {1, 2}}, {"lora_path", "adapter-1"}}, "lora_path", "LoRA"},
      {"/generate",
       {{"input_ids", {1, 2}}, {"return_hidden_states", true}},
       "return_hidden_states",
       "hidden states"},
      {"/generate", {{"input_ids", {1, 2}}, {"image_data", "x.png"}}, "image_data", "images"},
      {"/generate",
       {{"input_ids", {1, 2}}, {"sampling_params", {{"skip_special_tokens", false}}}},
       "sampling_params.skip_special_tokens",
       "only true"},
      {"/generate",
       {{"input_ids", {1, 2}}, {"sampling_params", {{"regex", "a+"}}}},
       "sampling_params.regex",
       "constrained decoding"},
      {"/generate", {{"input_ids", {1, 2}}, {"bogus", 1}}, "bogus", "unknown field"},
      {"/v1/completions",
       {{"prompt", "a"}, {"response_format", {{"type", "json_object"}}}},
       "response_format",
       "constrained decoding"},
      {"/v1/completions",
       {{"prompt", "a"}, {"stream_options", {{"include_usage", true}}}},
       "stream_options",
       "only allowed when stream is true"},
      {"/v1/completions",
       {{"prompt", "a"}, {"stream", true}, {"stream_options", {{"continuous", true}}}},
       "stream_options.continuous",
       "unknown field"},
      {"/v1/chat/completions",
       {{"messages",
         {{{"role", "user"},
           {"content", {{{"type", "text"}, {"text", "hi"}}, {{"type", "image_url"}}}}}}}},
       "messages[0].content[1].type",
       "'image_url' parts are not supported"},
      {"/v1/chat/completions",
       {{"messages", {{{"role", "assistant"}, {"content", "x"}, {"tool_calls", json::array()}}}}},
       "messages[0].tool_calls",
       "tools are not supported"},
      {"/v1/chat/completions",
       {{"messages", {{{"role", "user"}, {"content", "x"}}}},
        {"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}},
       "tools",
       "tools are not supported"},
      {"/v1/completions", {{"prompt", "a"}, {"frobnicate", true}}, "frobnicate", "unknown field"},
  };
  for (const Case& c : cases) {
    const auto [param, message] = refused(post(port_, c.path, c.body));
    EXPECT_EQ(param, c.param) << c.body.dump() << ": " << message;
    EXPECT_NE(message.find(c.words), std::string::npos) << c.body.dump() << ": " << message;
  }
}

// A string, a list of strings, a list of ids and a list of id lists: one choice per prompt, in
// the order given, each the answer its prompt gets alone; a list streams with choice indexes.
TEST_F(ApiParityTest, CompletionsTakeEveryPromptShapeWithOneChoicePerPrompt) {
  serve({"model.preset=synth-tiny"});
  auto complete = [&](const json& prompt) {
    Reply r =
        post(port_, "/v1/completions",
             {{"prompt", prompt}, {"max_tokens", 6}, {"ignore_eos", true}, {"temperature", 0}});
    EXPECT_EQ(r.status, 200) << r.body;
    return r.json_body();
  };
  const std::string a = complete("Once upon")["choices"][0]["text"];
  const std::string b = complete("The dog")["choices"][0]["text"];
  const json texts = complete(json::array({"Once upon", "The dog"}));
  ASSERT_EQ(texts["choices"].size(), 2u);
  EXPECT_EQ(texts["choices"][0]["index"], 0);
  EXPECT_EQ(texts["choices"][0]["text"], a);
  EXPECT_EQ(texts["choices"][1]["index"], 1);
  EXPECT_EQ(texts["choices"][1]["text"], b);
  EXPECT_EQ(texts["usage"]["completion_tokens"], 12);

  const std::string ids_alone = complete(json::array({1, 5, 9}))["choices"][0]["text"];
  const json id_lists = complete(json::array({json::array({1, 5, 9}), json::array({1, 5, 9})}));
  ASSERT_EQ(id_lists["choices"].size(), 2u);
  EXPECT_EQ(id_lists["choices"][0]["text"], ids_alone);
  EXPECT_EQ(id_lists["choices"][1]["text"], ids_alone);

  Reply s = post(port_, "/v1/completions",
                 {{"prompt", {"Once upon", "The dog"}},
                  {"max_tokens", 6},
                  {"stream", true},
                  {"ignore_eos", true},
                  {"temperature", 0}});
  ASSERT_EQ(s.status, 200) << s.body;
  bool done = false;
  std::string streamed[2];
  int finished = 0;
  std::string id;
  for (const json& e : events_of(s.body, &done)) {
    const json& c = e["choices"][0];
    const size_t index = c["index"];
    ASSERT_LT(index, 2u);
    streamed[index] += c["text"].get<std::string>();
    finished += c["finish_reason"].is_string() ? 1 : 0;
    if (id.empty()) id = e["id"];
    EXPECT_EQ(e["id"], id);  // one id for the call, as OpenAI's
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(streamed[0], a);
  EXPECT_EQ(streamed[1], b);
  EXPECT_EQ(finished, 2);

  EXPECT_EQ(refused(post(port_, "/v1/completions", {{"prompt", {"a", 3}}})).first, "prompt[1]");
  EXPECT_EQ(refused(post(port_, "/v1/completions", {{"prompt", json::object()}})).first, "prompt");
}

// Content as a list of text parts is the parts joined by newlines (vLLM's rendering).
TEST_F(ApiParityTest, ChatContentPartsAreTheirTextJoined) {
  serve({"model.preset=synth-tiny"});
  auto chat = [&](const json& content) {
    Reply r = post(port_, "/v1/chat/completions",
                   {{"messages", {{{"role", "user"}, {"content", content}}}},
                    {"max_tokens", 6},
                    {"ignore_eos", true},
                    {"temperature", 0}});
    EXPECT_EQ(r.status, 200) << r.body;
    return r.json_body()["choices"][0]["message"]["content"].get<std::string>();
  };
  EXPECT_EQ(chat(json::array(
                {{{"type", "text"}, {"text", "Once"}}, {{"type", "text"}, {"text", "upon"}}})),
            chat("Once\nupon"));
}

// stream_options.include_usage: every chunk has "usage": null and a last chunk with no choices
// carries the usage; without it no chunk has usage.
TEST_F(ApiParityTest, StreamOptionsIncludeUsageIsHonoured) {
  serve({"model.preset=synth-tiny"});
  for (bool include : {true, false}) {
    // Greedy: its tokens are whole characters here, so each is a chunk of its own.
    json body = {{"prompt", "Once"},
                 {"max_tokens", 5},
                 {"stream", true},
                 {"ignore_eos", true},
                 {"temperature", 0}};
    if (include) body["stream_options"] = {{"include_usage", true}};
    Reply r = post(port_, "/v1/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    bool done = false;
    const std::vector<json> events = events_of(r.body, &done);
    ASSERT_GE(events.size(), 2u);
    EXPECT_TRUE(done);
    for (size_t i = 0; i + 1 < events.size(); ++i) {
      EXPECT_EQ(events[i].contains("usage"), include) << events[i].dump();
      if (include) {
        EXPECT_TRUE(events[i]["usage"].is_null()) << events[i].dump();
      }
    }
    const json& last = events.back();
    if (include) {
      EXPECT_TRUE(last["choices"].empty()) << last.dump();
      EXPECT_EQ(last["usage"]["completion_tokens"], 5);
      EXPECT_EQ(last["usage"]["total_tokens"], last["usage"]["prompt_tokens"].get<int>() + 5);
    } else {
      EXPECT_FALSE(last.contains("usage")) << last.dump();
      EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
    }
  }
}

// sampling_params.no_stop_trim: the answer keeps the stop string, streamed or not.
TEST_F(ApiParityTest, NoStopTrimKeepsTheStopString) {
  if (!has_model()) GTEST_SKIP() << model_dir() << " not found";
  serve({"model.path=\"" + model_dir() + "\""});
  const json sp = {
      {"max_new_tokens", 27}, {"stop", {" girl"}}, {"no_stop_trim", true}, {"temperature", 0}};
  Reply r = post(port_, "/generate", {{"text", "Once upon a time"}, {"sampling_params", sp}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json_body()["text"], ", there was a little girl");
  Reply s = post(port_, "/generate",
                 {{"text", "Once upon a time"}, {"sampling_params", sp}, {"stream", true}});
  bool done = false;
  const std::vector<json> events = events_of(s.body, &done);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["text"], ", there was a little girl");
  EXPECT_EQ(events.back()["meta_info"]["finish_reason"]["matched"], " girl");
}

// [server] incremental_streaming_output: each /generate event has only the new ids and text.
TEST_F(ApiParityTest, IncrementalStreamingOutputSendsOnlyTheNewIdsAndText) {
  serve({"model.preset=synth-tiny", "server.incremental_streaming_output=true"});
  const json sp = {{"max_new_tokens", 6}, {"ignore_eos", true}, {"temperature", 0}};
  const json whole =
      post(port_, "/generate", {{"text", "Once"}, {"sampling_params", sp}}).json_body();
  Reply s = post(port_, "/generate", {{"text", "Once"}, {"sampling_params", sp}, {"stream", true}});
  bool done = false;
  std::vector<int32_t> ids;
  std::string text;
  const std::vector<json> events = events_of(s.body, &done);
  for (const json& e : events) {
    EXPECT_EQ(e["output_ids"].size(), 1u) << e.dump();
    for (int32_t id : ids_of(e)) ids.push_back(id);
    text += e["text"].get<std::string>();
  }
  EXPECT_EQ(events.size(), 6u);
  EXPECT_EQ(ids, ids_of(whole));
  EXPECT_EQ(text, whole["text"]);
}

// /server_info and /model_info answer as /get_server_info and /get_model_info; /get_load has
// SGLang's shape; GET /flush_cache empties the cache as POST does.
TEST_F(ApiParityTest, SglangEndpointNamesAndShapes) {
  serve({"model.preset=synth-tiny"});
  const Reply server_info = call(port_, http::verb::get, "/server_info", "");
  ASSERT_EQ(server_info.status, 200);
  EXPECT_EQ(server_info.body, call(port_, http::verb::get, "/get_server_info", "").body);
  const Reply model_info = call(port_, http::verb::get, "/model_info", "");
  ASSERT_EQ(model_info.status, 200);
  EXPECT_EQ(model_info.body, call(port_, http::verb::get, "/get_model_info", "").body);
  const Reply load = call(port_, http::verb::get, "/get_load", "");
  ASSERT_EQ(load.status, 200) << load.body;
  const json l = load.json_body();
  ASSERT_TRUE(l.is_array()) << load.body;
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0]["dp_rank"], 0);
  EXPECT_EQ(l[0]["num_reqs"], 0);
  EXPECT_EQ(l[0]["num_waiting_reqs"], 0);
  EXPECT_EQ(l[0]["num_tokens"], 0);
  EXPECT_EQ(call(port_, http::verb::get, "/flush_cache", "").status, 200);
}

// Log-probabilities in SGLang's, OpenAI completions' and OpenAI chat's shapes, streamed and not:
// greedy picks the likeliest, so the chosen token is the first of the top ones; every value is
// finite and <= 0, and the tokens' texts add up to the answer.
TEST_F(ApiParityTest, LogprobsInEachApisShape) {
  if (!has_model()) GTEST_SKIP() << model_dir() << " not found";
  serve({"model.path=\"" + model_dir() + "\""});
  const Reply g =
      post(port_, "/generate",
           {{"text", "Once upon a time"},
            {"sampling_params", {{"max_new_tokens", 8}, {"ignore_eos", true}, {"temperature", 0}}},
            {"return_logprob", true},
            {"top_logprobs_num", 3},
            {"return_text_in_logprobs", true}});
  ASSERT_EQ(g.status, 200) << g.body;
  const json gj = g.json_body();
  const json& chosen = gj["meta_info"]["output_token_logprobs"];
  const json& top = gj["meta_info"]["output_top_logprobs"];
  ASSERT_EQ(chosen.size(), 8u) << g.body;
  ASSERT_EQ(top.size(), 8u);
  std::string joined;
  std::vector<float> lps;
  for (size_t i = 0; i < 8; ++i) {
    const float lp = chosen[i][0];
    lps.push_back(lp);
    EXPECT_TRUE(std::isfinite(lp) && lp <= 0) << lp;
    EXPECT_EQ(chosen[i][1], gj["output_ids"][i]);
    joined += chosen[i][2].get<std::string>();
    ASSERT_EQ(top[i].size(), 3u);
    EXPECT_EQ(top[i][0][1], chosen[i][1]);
    EXPECT_FLOAT_EQ(top[i][0][0].get<float>(), lp);
    EXPECT_GE(top[i][0][0].get<float>(), top[i][1][0].get<float>());
    EXPECT_GE(top[i][1][0].get<float>(), top[i][2][0].get<float>());
  }
  EXPECT_EQ(joined, gj["text"]);

  const json body = {{"prompt", "Once upon a time"},
                     {"max_tokens", 8},
                     {"logprobs", 2},
                     {"ignore_eos", true},
                     {"temperature", 0}};
  const Reply c = post(port_, "/v1/completions", body);
  ASSERT_EQ(c.status, 200) << c.body;
  const json cj = c.json_body();
  const json& lp = cj["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 8u) << c.body;
  std::string tokens;
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_FLOAT_EQ(lp["token_logprobs"][i].get<float>(), lps[i]);
    const std::string t = lp["tokens"][i];
    EXPECT_TRUE(lp["top_logprobs"][i].contains(t));
    EXPECT_LE(lp["top_logprobs"][i].size(), 3u);     // the two likeliest and the chosen one
    EXPECT_EQ(lp["text_offset"][i], tokens.size());  // ASCII: characters are bytes
    tokens += t;
  }
  EXPECT_EQ(tokens, cj["choices"][0]["text"]);
  json streamed_body = body;
  streamed_body["stream"] = true;
  bool done = false;
  json tokens_streamed = json::array(), offsets_streamed = json::array();
  for (const json& e : events_of(post(port_, "/v1/completions", streamed_body).body, &done)) {
    const json& l = e["choices"][0]["logprobs"];
    for (const json& t : l["tokens"]) tokens_streamed.push_back(t);
    for (const json& o : l["text_offset"]) offsets_streamed.push_back(o);
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(tokens_streamed, lp["tokens"]);
  EXPECT_EQ(offsets_streamed, lp["text_offset"]);

  const Reply chat = post(port_, "/v1/chat/completions",
                          {{"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}},
                           {"max_tokens", 6},
                           {"logprobs", true},
                           {"top_logprobs", 2},
                           {"ignore_eos", true}});
  ASSERT_EQ(chat.status, 200) << chat.body;
  const json chat_json = chat.json_body();
  const json& content = chat_json["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 6u) << chat.body;
  std::string said;
  for (const json& entry : content) {
    EXPECT_LE(entry["logprob"].get<float>(), 0.0f);
    EXPECT_EQ(entry["top_logprobs"].size(), 2u);
    std::string bytes;
    for (int b : entry["bytes"]) bytes += static_cast<char>(b);
    EXPECT_EQ(bytes, entry["token"]);
    said += entry["token"].get<std::string>();
  }
  EXPECT_EQ(said, chat_json["choices"][0]["message"]["content"]);

  // Without asking: nothing, at no cost.
  const Reply plain = post(port_, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 2}});
  EXPECT_TRUE(plain.json_body()["choices"][0]["logprobs"].is_null()) << plain.body;

  EXPECT_EQ(refused(post(port_, "/v1/chat/completions",
                         {{"messages", {{{"role", "user"}, {"content", "x"}}}},
                          {"logprobs", true},
                          {"top_logprobs", 21}}))
                .first,
            "top_logprobs");
  EXPECT_EQ(
      refused(post(port_, "/v1/chat/completions",
                   {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"top_logprobs", 2}}))
          .first,
      "top_logprobs");
  EXPECT_EQ(refused(post(port_, "/v1/completions", {{"prompt", "x"}, {"logprobs", 30}})).first,
            "logprobs");
  EXPECT_EQ(
      refused(post(port_, "/v1/completions", {{"prompt", "x"}, {"echo", true}, {"stream", true}}))
          .first,
      "echo");
}

// The prompt's log-probabilities come from the prefill's logits, one row per position: a prompt
// that is a greedy continuation has, for those tokens, the log-probabilities the decode steps
// gave them -- whole, in chunks of 3 (chunked_prefill_size), over two TP ranks, and with the
// prompt's first pages in the prefix cache (its wanted positions are recomputed). OpenAI's echo
// puts them first.
class PromptLogprobsTest : public ServerTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(PromptLogprobsTest, PromptLogprobsAreTheDecodeStepsOnes) {
  if (!has_model()) GTEST_SKIP() << model_dir() << " not found";
  serve({"model.path=\"" + model_dir() + "\"", GetParam()});
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};  // "Once upon a time"
  const json decoded =
      post(port_, "/generate",
           {{"input_ids", prompt},
            {"sampling_params", {{"max_new_tokens", 6}, {"ignore_eos", true}, {"temperature", 0}}},
            {"return_logprob", true}})
          .json_body();
  std::vector<int32_t> longer = prompt;
  for (const json& id : decoded["output_ids"]) longer.push_back(id);
  // Twice: the second finds the first's pages in the cache and must not use them past position 4.
  for (int round = 0; round < 2; ++round) {
    const Reply r = post(port_, "/generate",
                         {{"input_ids", longer},
                          {"sampling_params", {{"max_new_tokens", 1}}},
                          {"return_logprob", true},
                          {"logprob_start_len", 5},
                          {"top_logprobs_num", 2}});
    ASSERT_EQ(r.status, 200) << r.body;
    const json body = r.json_body();
    const json& input = body["meta_info"]["input_token_logprobs"];
    ASSERT_EQ(input.size(), 6u) << r.body;  // positions 5 .. 10
    for (size_t k = 0; k < 6; ++k) {
      EXPECT_EQ(input[k][1], longer[5 + k]);
      EXPECT_NEAR(input[k][0].get<double>(),
                  decoded["meta_info"]["output_token_logprobs"][k][0].get<double>(), 2e-3)
          << "position " << 5 + k << ", round " << round;
    }
    EXPECT_EQ(body["meta_info"]["input_top_logprobs"][0].size(), 2u);
  }
  // From position 0: the first has nothing before it.
  const json all = post(port_, "/generate",
                        {{"input_ids", prompt},
                         {"sampling_params", {{"max_new_tokens", 1}}},
                         {"return_logprob", true},
                         {"logprob_start_len", 0}})
                       .json_body();
  const json& input = all["meta_info"]["input_token_logprobs"];
  ASSERT_EQ(input.size(), 5u) << all.dump();
  EXPECT_TRUE(input[0][0].is_null());
  EXPECT_EQ(input[0][1], 1);
  for (size_t k = 1; k < 5; ++k) EXPECT_LE(input[k][0].get<double>(), 0.0);
  // OpenAI's echo: the prompt's text and log-probabilities first.
  const json echo =
      post(port_, "/v1/completions",
           {{"prompt", "Once upon a time"}, {"max_tokens", 2}, {"logprobs", 1}, {"echo", true}})
          .json_body();
  const json& lp = echo["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 7u) << echo.dump();
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_NEAR(lp["token_logprobs"][1].get<double>(), input[1][0].get<double>(), 1e-6);
  EXPECT_EQ(echo["choices"][0]["text"].get<std::string>().rfind("Once upon a time", 0), 0u);
  EXPECT_EQ(
      refused(post(port_, "/generate",
                   {{"input_ids", prompt}, {"return_logprob", true}, {"logprob_start_len", 5}}))
          .first,
      "logprob_start_len");
}

INSTANTIATE_TEST_SUITE_P(Prefill, PromptLogprobsTest,
                         ::testing::Values("scheduler.chunked_prefill_size=-1",
                                           "scheduler.chunked_prefill_size=3", "tp.size=2"));

// frequency, presence and repetition penalties, logit_bias and min_tokens reach the sampler;
// out-of-range values are refused naming the API's own field.
TEST_F(ApiParityTest, PenaltiesLogitBiasAndMinTokensReachTheSampler) {
  serve({"model.preset=synth-tiny"});
  auto ids = [&](json sp) {
    sp["temperature"] = 0;  // greedy: the biases and penalties decide
    const Reply r = post(port_, "/generate", {{"input_ids", {1, 2, 3}}, {"sampling_params", sp}});
    EXPECT_EQ(r.status, 200) << r.body;
    return r.json_body();
  };
  const json forced =
      ids({{"max_new_tokens", 5}, {"ignore_eos", true}, {"logit_bias", {{"7", 100}}}});
  EXPECT_EQ(forced["output_ids"], json::array({7, 7, 7, 7, 7}));
  // 7 is a stop id and the likeliest, but held back for three tokens.
  const json held = ids({{"max_new_tokens", 10},
                         {"ignore_eos", true},
                         {"stop_token_ids", {7}},
                         {"min_new_tokens", 3},
                         {"logit_bias", {{"7", 100}}}});
  ASSERT_EQ(held["output_ids"].size(), 4u) << held.dump();
  EXPECT_EQ(held["output_ids"][3], 7);
  EXPECT_EQ(held["meta_info"]["finish_reason"]["type"], "stop");
  // A presence penalty above the bias's lead moves greedy off a token once it appeared.
  const json moved = ids({{"max_new_tokens", 2},
                          {"ignore_eos", true},
                          {"presence_penalty", 2.0},
                          {"logit_bias", {{"7", 100}, {"9", 99}}}});
  EXPECT_EQ(moved["output_ids"], json::array({7, 9}));
  const json repeated = ids({{"max_new_tokens", 2},
                             {"ignore_eos", true},
                             {"frequency_penalty", 2.0},
                             {"logit_bias", {{"7", 100}, {"9", 99}}}});
  EXPECT_EQ(repeated["output_ids"], json::array({7, 9}));

  const json openai = post(port_, "/v1/completions",
                           {{"prompt", {1, 2, 3}},
                            {"max_tokens", 5},
                            {"min_tokens", 2},
                            {"logit_bias", {{"7", 100}}},
                            {"ignore_eos", true}})
                          .json_body();
  EXPECT_EQ(openai["usage"]["completion_tokens"], 5) << openai.dump();
  for (const auto& [body, param] : std::vector<std::pair<json, std::string>>{
           {{{"prompt", "x"}, {"frequency_penalty", 3}}, "frequency_penalty"},
           {{{"prompt", "x"}, {"presence_penalty", -2.5}}, "presence_penalty"},
           {{{"prompt", "x"}, {"repetition_penalty", 0}}, "repetition_penalty"},
           {{{"prompt", "x"}, {"logit_bias", {{"x7", 1}}}}, "logit_bias"},
           {{{"prompt", "x"}, {"logit_bias", {{"99999999", 1}}}}, "logit_bias"},
           {{{"prompt", "x"}, {"logit_bias", {{"7", 101}}}}, "logit_bias"},
           {{{"prompt", "x"}, {"max_tokens", 3}, {"min_tokens", 4}}, "min_tokens"}}) {
    EXPECT_EQ(refused(post(port_, "/v1/completions", body)).first, param) << body.dump();
  }
  EXPECT_EQ(refused(post(port_, "/generate",
                         {{"input_ids", {1, 2}},
                          {"sampling_params", {{"max_new_tokens", 2}, {"min_new_tokens", 3}}}}))
                .first,
            "sampling_params.min_new_tokens");
}

// n choices of one prompt: each its own seed stream, index and finish reason, one prefill shared
// through the prefix cache, usage counting the prompt once; best_of answers the candidates with
// the highest cumulative log-probability.
TEST_F(ApiParityTest, NChoicesShareOnePrefillAndBestOfRanksByLogprob) {
  if (!has_model()) GTEST_SKIP() << model_dir() << " not found";
  serve({"model.path=\"" + model_dir() + "\""});
  // Three pages of prompt (page_size 16), so the later choices find the first's pages cached.
  std::vector<int32_t> prompt = {1};
  for (int i = 0; i < 47; ++i) prompt.push_back(300 + i % 90);
  const json sp = {
      {"max_new_tokens", 8}, {"temperature", 1.0}, {"seed", 5}, {"n", 3}, {"ignore_eos", true}};
  const Reply g = post(port_, "/generate", {{"input_ids", prompt}, {"sampling_params", sp}});
  ASSERT_EQ(g.status, 200) << g.body;
  const json choices = g.json_body();
  ASSERT_TRUE(choices.is_array());
  ASSERT_EQ(choices.size(), 3u);
  EXPECT_EQ(choices[0]["meta_info"]["cached_tokens"], 0);
  std::set<std::vector<int32_t>> distinct;
  for (size_t j = 0; j < 3; ++j) {
    if (j > 0) {
      EXPECT_GE(choices[j]["meta_info"]["cached_tokens"].get<int>(), 32) << g.body;
    }
    EXPECT_EQ(choices[j]["output_ids"].size(), 8u);
    distinct.insert(ids_of(choices[j]));
  }
  EXPECT_GT(distinct.size(), 1u);  // three seeds, not three copies

  const json body = {{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 1.0}, {"seed", 5},
                     {"n", 3},           {"logprobs", 0},   {"ignore_eos", true}};
  const Reply c = post(port_, "/v1/completions", body);
  ASSERT_EQ(c.status, 200) << c.body;
  const json cj = c.json_body();
  ASSERT_EQ(cj["choices"].size(), 3u);
  EXPECT_EQ(cj["usage"]["prompt_tokens"], 48);
  EXPECT_EQ(cj["usage"]["completion_tokens"], 24);
  double best = -1e30;
  std::string best_text;
  for (size_t j = 0; j < 3; ++j) {
    const json& choice = cj["choices"][j];
    EXPECT_EQ(choice["index"], j);
    EXPECT_EQ(choice["finish_reason"], "length");
    double total = 0;
    for (const json& lp : choice["logprobs"]["token_logprobs"]) total += lp.get<double>();
    if (total > best) best = total, best_text = choice["text"];
  }
  json best_of = body;
  best_of["n"] = 1;
  best_of["best_of"] = 3;
  const Reply b = post(port_, "/v1/completions", best_of);
  ASSERT_EQ(b.status, 200) << b.body;
  ASSERT_EQ(b.json_body()["choices"].size(), 1u);
  EXPECT_EQ(b.json_body()["choices"][0]["text"], best_text);  // the same three candidates

  // Streamed: each choice's chunks under its index add up to the unstreamed choice.
  json streamed = body;
  streamed["stream"] = true;
  bool done = false;
  std::string texts[3];
  for (const json& e : events_of(post(port_, "/v1/completions", streamed).body, &done)) {
    const size_t index = e["choices"][0]["index"];
    ASSERT_LT(index, 3u);
    texts[index] += e["choices"][0]["text"].get<std::string>();
  }
  EXPECT_TRUE(done);
  for (size_t j = 0; j < 3; ++j) EXPECT_EQ(texts[j], cj["choices"][j]["text"]);

  EXPECT_EQ(
      refused(post(port_, "/v1/completions", {{"prompt", "x"}, {"n", 3}, {"best_of", 2}})).first,
      "best_of");
  EXPECT_EQ(
      refused(post(port_, "/v1/completions", {{"prompt", "x"}, {"best_of", 2}, {"stream", true}}))
          .first,
      "best_of");
  EXPECT_EQ(refused(post(port_, "/v1/completions", {{"prompt", "x"}, {"n", 0}})).first, "n");
  EXPECT_EQ(refused(post(port_, "/generate",
                         {{"text", "x"}, {"stream", true}, {"sampling_params", {{"n", 2}}}}))
                .first,
            "sampling_params.n");
}

// /v1/responses, its text subset: the conversation (instructions first) through the chat
// template, answered as the chat endpoint answers it; a stream's events in order, their
// sequence numbers counting up, the deltas adding up to the text; what it cannot do refused.
TEST_F(ApiParityTest, ResponsesApiTextSubset) {
  serve({"model.preset=synth-tiny"});
  const json chat = post(port_, "/v1/chat/completions",
                         {{"messages",
                           {{{"role", "system"}, {"content", "Be brief"}},
                            {{"role", "user"}, {"content", "Once"}}}},
                          {"max_tokens", 6},
                          {"ignore_eos", true},
                          {"temperature", 0}})
                        .json_body();
  const std::string want = chat["choices"][0]["message"]["content"];
  const json body = {
      {"model", "m"},
      {"instructions", "Be brief"},
      {"input", {{{"role", "user"}, {"content", {{{"type", "input_text"}, {"text", "Once"}}}}}}},
      {"max_output_tokens", 6},
      {"temperature", 0},
      {"store", false}};
  const Reply r = post(port_, "/v1/responses", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.json_body();
  EXPECT_EQ(j["object"], "response");
  EXPECT_EQ(j["model"], "m");
  EXPECT_EQ(j["id"].get<std::string>().rfind("resp_", 0), 0u);
  EXPECT_EQ(j["status"], "incomplete");
  EXPECT_EQ(j["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(j["output"][0]["role"], "assistant");
  EXPECT_EQ(j["output"][0]["content"][0]["type"], "output_text");
  EXPECT_EQ(j["output"][0]["content"][0]["text"], want);
  EXPECT_EQ(j["usage"]["output_tokens"], 6);
  EXPECT_EQ(j["usage"]["input_tokens"], chat["usage"]["prompt_tokens"]);

  json streamed = body;
  streamed["stream"] = true;
  const Reply s = post(port_, "/v1/responses", streamed);
  ASSERT_EQ(s.status, 200) << s.body;
  EXPECT_NE(s.body.find("event: response.created\ndata: {"), std::string::npos) << s.body;
  bool done = false;
  std::vector<std::string> types;
  std::string text;
  int64_t sequence = -1;
  json last;
  for (const json& e : events_of(s.body, &done)) {
    types.push_back(e["type"]);
    EXPECT_EQ(e["sequence_number"].get<int64_t>(), sequence + 1);
    sequence = e["sequence_number"];
    if (e["type"] == "response.output_text.delta") text += e["delta"].get<std::string>();
    last = e;
  }
  EXPECT_FALSE(done);  // the Responses API ends with its last event, no [DONE]
  ASSERT_GE(types.size(), 8u);
  const std::vector<std::string> head = {"response.created", "response.in_progress",
                                         "response.output_item.added",
                                         "response.content_part.added"};
  EXPECT_EQ(std::vector<std::string>(types.begin(), types.begin() + 4), head);
  const std::vector<std::string> tail = {"response.output_text.done", "response.content_part.done",
                                         "response.output_item.done", "response.incomplete"};
  EXPECT_EQ(std::vector<std::string>(types.end() - 4, types.end()), tail);
  EXPECT_EQ(text, want);
  EXPECT_EQ(last["response"]["output"][0]["content"][0]["text"], want);

  for (const auto& [b, param] : std::vector<std::pair<json, std::string>>{
           {{{"input", "x"}, {"tools", {{{"type", "function"}, {"name", "f"}}}}}, "tools"},
           {{{"input", "x"}, {"previous_response_id", "resp_1"}}, "previous_response_id"},
           {{{"input", "x"}, {"store", true}}, "store"},
           {{{"input", {{{"type", "function_call_output"}, {"output", "1"}}}}}, "input[0].type"},
           {{{"input", {{{"role", "user"}, {"content", {{{"type", "input_image"}}}}}}}},
            "input[0].content[0].type"},
           {{{"input", "x"}, {"text", {{"format", {{"type", "json_schema"}}}}}}, "text.format"},
           {{{"input", "x"}, {"max_output_tokens", 0}}, "max_output_tokens"},
           {{{"instructions", "x"}}, "input"},
           {{{"input", "x"}, {"frobnicate", 1}}, "frobnicate"}}) {
    EXPECT_EQ(refused(post(port_, "/v1/responses", b)).first, param) << b.dump();
  }
}

// [server] metric_names: SGLang's names with its model_name label, kvrt's, or both (default).
class MetricNamesTest : public ServerTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(MetricNamesTest, MetricsCarrySglangNamesWhenAsked) {
  const std::string names = GetParam();
  serve({"model.preset=synth-tiny", "server.metric_names=\"" + names + "\""});
  ASSERT_EQ(post(port_, "/generate",
                 {{"input_ids", {1, 2}},
                  {"sampling_params", {{"max_new_tokens", 3}, {"ignore_eos", true}}}})
                .status,
            200);
  const std::string m = call(port_, http::verb::get, "/metrics", "").body;
  const bool kvrt = names != "sglang", sglang = names != "kvrt";
  EXPECT_EQ(m.find("\nkvrt:num_requests_total 1\n") != std::string::npos, kvrt) << m;
  EXPECT_EQ(
      m.find("\nsglang:num_requests_total{model_name=\"test-model\"} 1\n") != std::string::npos,
      sglang)
      << m;
  EXPECT_EQ(m.find("# TYPE sglang:time_to_first_token_seconds histogram\n") != std::string::npos,
            sglang);
  EXPECT_EQ(m.find("sglang:time_to_first_token_seconds_bucket{model_name=\"test-model\",le=") !=
                std::string::npos,
            sglang)
      << m;
}

INSTANTIATE_TEST_SUITE_P(Names, MetricNamesTest, ::testing::Values("both", "sglang", "kvrt"));

}  // namespace
}  // namespace kvrt::http
