// The API's pure functions apart from any server: generate_event, the streamed /generate event
// built from what earlier events already escaped, is exactly to_text(generate_json(...)) at
// every step of a stream -- ASCII, quotes, control characters, multibyte characters, bytes that
// are not UTF-8 (replaced by U+FFFD as a whole dump replaces them), log-probabilities, the end;
// the defaults a request gets (kvrt's, or a generation_config.json's); the bodies refused by
// the field at fault (a role, a number beyond a double, bytes after the JSON); choices' seeds.
#include "core/api/generate.h"
#include "core/api/openai.h"
#include "core/text/tokenizer.h"
#include "core/api/prompt.h"
#include "core/api/responses.h"
#include "core/api/tokenize.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <variant>
#include <vector>

namespace kvrt::api {
namespace {

using nlohmann::json;

// The error of a body that parse_generate / parse_openai refuses ("<accepted>" when it does not).
std::string refused_param(const std::variant<GenerateCall, ApiError>& parsed) {
  const ApiError* e = std::get_if<ApiError>(&parsed);
  return e == nullptr ? "<accepted>" : e->param;
}

// Without a generation_config.json a request samples at temperature 1 with no cut, as SGLang's
// and OpenAI's do; completions default to 16 tokens, /generate to 128.
TEST(RequestDefaults, WithoutGenerationConfigTemperatureOneAndOpenAiLengths) {
  ModelLimits limits;
  limits.context_length = 512;
  auto g = parse_generate(R"({"input_ids": [1, 2]})", limits);
  ASSERT_TRUE(std::holds_alternative<GenerateCall>(g));
  const GenerateCall& call = std::get<GenerateCall>(g);
  EXPECT_EQ(call.sampling.temperature, 1.0f);
  EXPECT_EQ(call.sampling.top_p, 1.0f);
  EXPECT_EQ(call.sampling.top_k, 0);
  EXPECT_EQ(call.max_new_tokens, 128);
  EXPECT_FALSE(call.seeded);
  auto c = parse_openai(R"({"prompt": [1, 2]})", limits, /*chat=*/false);
  ASSERT_TRUE(std::holds_alternative<GenerateCall>(c));
  EXPECT_EQ(std::get<GenerateCall>(c).max_new_tokens, 16);
  // Greedy when asked for.
  auto greedy = parse_openai(R"({"prompt": [1, 2], "temperature": 0})", limits, false);
  EXPECT_EQ(std::get<GenerateCall>(greedy).sampling.temperature, 0.0f);
  const json d = defaults_json(limits.defaults);
  EXPECT_EQ(d["temperature"], 1.0);
  EXPECT_EQ(d["completions_max_tokens"], 16);
  EXPECT_TRUE(d["chat_max_tokens"].is_null());
}

// generation_config.json's values are the defaults (vLLM's and SGLang's rule); do_sample false
// is greedy whatever its temperature; its max_new_tokens is every API's default length; what a
// request sets wins.
TEST(RequestDefaults, GenerationConfigSetsThemAndDoSampleFalseIsGreedy) {
  Result<model::GenerationConfig> g = model::read_generation_config(
      R"({"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.05,
          "repetition_penalty": 1.1, "max_new_tokens": 40, "eos_token_id": [1, 2],
          "max_length": 9999, "transformers_version": "4.51.0"})",
      "m/generation_config.json");
  ASSERT_TRUE(g.ok()) << g.status().message();
  ModelLimits limits;
  limits.context_length = 512;
  limits.defaults = request_defaults(*g);
  EXPECT_EQ(limits.defaults.source, "m/generation_config.json");
  auto call = std::get<GenerateCall>(parse_generate(R"({"input_ids": [1]})", limits));
  EXPECT_EQ(call.sampling.temperature, 0.6f);
  EXPECT_EQ(call.sampling.top_p, 0.95f);
  EXPECT_EQ(call.sampling.top_k, 20);
  EXPECT_EQ(call.sampling.min_p, 0.05f);
  EXPECT_EQ(call.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(call.max_new_tokens, 40);
  EXPECT_EQ(
      std::get<GenerateCall>(parse_openai(R"({"prompt": [1]})", limits, false)).max_new_tokens, 40);
  auto mine = std::get<GenerateCall>(parse_generate(
      R"({"input_ids": [1], "sampling_params": {"temperature": 0.2, "max_new_tokens": 3}})",
      limits));
  EXPECT_EQ(mine.sampling.temperature, 0.2f);
  EXPECT_EQ(mine.max_new_tokens, 3);

  Result<model::GenerationConfig> greedy =
      model::read_generation_config(R"({"do_sample": false, "temperature": 0.6})", "g.json");
  ASSERT_TRUE(greedy.ok());
  EXPECT_EQ(request_defaults(*greedy).sampling.temperature, 0.0f);
}

// A bad generation_config.json stops the start naming the file and the key; a directory without
// one is no error.
TEST(RequestDefaults, ABadGenerationConfigNamesTheFileAndKey) {
  for (const auto& [text, key] : std::vector<std::pair<std::string, std::string>>{
           {R"({"temperature": "hot"})", "temperature"},
           {R"({"temperature": -1})", "temperature"},
           {R"({"top_p": 0})", "top_p"},
           {R"({"top_k": 2.5})", "top_k"},
           {R"({"min_p": 2})", "min_p"},
           {R"({"repetition_penalty": 0})", "repetition_penalty"},
           {R"({"max_new_tokens": 0})", "max_new_tokens"},
           {R"({"do_sample": "yes"})", "do_sample"}}) {
    Result<model::GenerationConfig> g =
        model::read_generation_config(text, "d/generation_config.json");
    ASSERT_FALSE(g.ok()) << text;
    EXPECT_EQ(g.status().message().rfind("d/generation_config.json: " + key + ": expected", 0), 0u)
        << g.status().message();
  }
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kvrt_gencfg_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  Result<model::GenerationConfig> none = model::load_generation_config(dir.string());
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_EQ(none->path, "");
  std::ofstream(dir / "generation_config.json") << "[1, 2]";
  Result<model::GenerationConfig> bad = model::load_generation_config(dir.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find((dir / "generation_config.json").string()),
            std::string::npos)
      << bad.status().message();
  std::filesystem::remove_all(dir);
}

// seed and sampling_seed (SGLang's name) give the call its seed; without one it is unseeded
// (the server draws one). Both, differing, is refused.
TEST(RequestDefaults, SeedAndSamplingSeedSeedTheCall) {
  ModelLimits limits;
  for (const char* key : {"seed", "sampling_seed"}) {
    auto call = std::get<GenerateCall>(parse_generate(
        std::string(R"({"input_ids": [1], "sampling_params": {")") + key + R"(": 42}})", limits));
    EXPECT_TRUE(call.seeded) << key;
    EXPECT_EQ(call.sampling.seed, 42u) << key;
  }
  EXPECT_EQ(
      refused_param(parse_generate(
          R"({"input_ids": [1], "sampling_params": {"seed": 1, "sampling_seed": 2}})", limits)),
      "sampling_params.seed");  // (read after sampling_seed: nlohmann orders the keys)
  auto openai =
      std::get<GenerateCall>(parse_openai(R"({"prompt": [1], "seed": 9})", limits, false));
  EXPECT_TRUE(openai.seeded);
  EXPECT_EQ(openai.sampling.seed, 9u);
}

// A prompt's choices: the first samples with the call's seed, the others with seeds derived
// from it, all different and the same every time; nearby seeds share no choice's stream.
TEST(ChoiceSeed, TheFirstIsTheSeedTheOthersDistinctAndStable) {
  EXPECT_EQ(choice_seed(42, 0), 42u);
  std::set<uint64_t> seen;
  for (uint64_t seed : {41u, 42u, 43u}) {
    for (size_t j = 0; j < 8; ++j) {
      EXPECT_EQ(choice_seed(seed, j), choice_seed(seed, j));
      seen.insert(choice_seed(seed, j));
    }
  }
  EXPECT_EQ(seen.size(), 24u);
}

// OpenAI's roles reach the template (developer as system); any other is a 400 naming
// messages[i].role, not a message silently left out.
TEST(ChatMessages, AnUnknownRoleIsRefusedAndDeveloperIsSystem) {
  auto read = [](const char* body) { return read_chat_messages(json::parse(body)); };
  auto ok = read(R"({"messages": [{"role": "developer", "content": "be brief"},
                                  {"role": "user", "content": "hi"},
                                  {"role": "assistant", "content": "hello"},
                                  {"role": "tool", "content": "42"},
                                  {"role": "system", "content": "s"}]})");
  ASSERT_TRUE(std::holds_alternative<std::vector<text::ChatMessage>>(ok));
  const auto& messages = std::get<std::vector<text::ChatMessage>>(ok);
  EXPECT_EQ(messages[0].role, "system");
  EXPECT_EQ(messages[3].role, "tool");
  for (const char* role : {"wizard", "System", ""}) {
    auto bad = read((std::string(R"({"messages": [{"role": "user", "content": "a"},
                                                  {"role": ")") +
                     role + R"(", "content": "b"}]})")
                        .c_str());
    ASSERT_TRUE(std::holds_alternative<ApiError>(bad)) << role;
    EXPECT_EQ(std::get<ApiError>(bad).param, "messages[1].role");
    EXPECT_EQ(std::get<ApiError>(bad).status, 400);
  }
}

// Bytes after the JSON body, a NUL byte among them, are a 400; a number beyond a double (1e309)
// is refused naming its field, in every API.
TEST(RequestBody, TrailingBytesAreRefusedAndAnOutOfRangeNumberNamesItsField) {
  ModelLimits limits;
  using namespace std::string_literals;
  for (const std::string& body :
       {R"({"input_ids": [1]})"s + '\0', R"({"input_ids": [1]})"s + '\0' + "garbage",
        R"({"input_ids": [1]} {"input_ids": [2]})"s, R"({"input_ids": [1]}x)"s}) {
    auto r = parse_generate(body, limits);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << body;
    EXPECT_EQ(std::get<ApiError>(r).status, 400);
    EXPECT_NE(std::get<ApiError>(r).message.find("not valid JSON"), std::string::npos);
  }
  EXPECT_EQ(refused_param(parse_generate(
                R"({"input_ids": [1], "sampling_params": {"temperature": 1e309}})", limits)),
            "sampling_params.temperature");
  EXPECT_EQ(refused_param(parse_generate(R"({"input_ids": [1, -1e999]})", limits)), "input_ids[1]");
  EXPECT_EQ(refused_param(parse_openai(R"({"prompt": "a", "top_p": 1e309})", limits, false)),
            "top_p");
  auto r = parse_openai(R"({"prompt": "a", "temperature": 1e309})", limits, false);
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  EXPECT_EQ(std::get<ApiError>(r).message,
            "temperature: 1e309 is out of range (beyond a double's)");
}

TEST(GenerateEvent, EqualsTheWholeDumpAtEveryStep) {
  for (int logprobs : {-1, 2}) {
    GenerateCall call;
    call.sampling.logprobs = logprobs;
    GenerateResult r;
    r.rid = "r-1";
    r.prompt_tokens = 4;
    GenerateEventCache cache;
    const std::vector<std::string> pieces = {"Once",   " \"upon\"", "\\ a\n\ttime", "",
                                             "\x01 é", "日本",      "\xff\xfe",     " end"};
    int32_t id = 3;
    for (size_t i = 0; i < pieces.size(); ++i) {
      serve::RequestOutput out;
      out.new_ids = {id, id + 1};
      out.new_text = pieces[i];
      if (logprobs >= 0) {
        for (int32_t k : out.new_ids) out.new_logprobs.push_back({{k, -0.25f}, {{k, -0.25f}}});
      }
      id += 2;
      out.prompt_tokens = 4;
      out.finished = i + 1 == pieces.size();
      r.add(out);
      EXPECT_EQ(generate_event(call, r, &cache), to_text(generate_json(call, r))) << "step " << i;
    }
  }
}

// chat_template_kwargs (SGLang's and vLLM's): scalar template variables for chat and for
// /tokenize's messages; anything else, and names the server sets, refused naming the field.
TEST(ChatTemplateKwargs, ScalarsReachTheCallAndTheRestIsRefusedByField) {
  static const auto tokenizer = text::make_byte_tokenizer(512).value().release();
  ModelLimits limits;
  limits.tokenizer = tokenizer;
  limits.vocab_size = 512;
  limits.context_length = 512;
  auto ok = parse_openai(R"({"messages": [{"role": "user", "content": "Hi"}],
                             "chat_template_kwargs": {"thinking": false, "effort": "low"}})",
                         limits, /*chat=*/true);
  ASSERT_TRUE(std::holds_alternative<GenerateCall>(ok));
  const text::TemplateVariables& v = std::get<GenerateCall>(ok).template_variables;
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].first, "effort");  // nlohmann's objects are ordered by key
  EXPECT_EQ(v[1].second, false);
  const std::vector<std::pair<std::string, std::string>> refused = {
      {R"({"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": 3})",
       "chat_template_kwargs"},
      {R"({"messages": [{"role": "user", "content": "Hi"}],
           "chat_template_kwargs": {"thinking": {"a": 1}}})",
       "chat_template_kwargs.thinking"},
      {R"({"messages": [{"role": "user", "content": "Hi"}],
           "chat_template_kwargs": {"add_generation_prompt": false}})",
       "chat_template_kwargs.add_generation_prompt"},
  };
  for (const auto& [body, param] : refused) {
    EXPECT_EQ(refused_param(parse_openai(body, limits, true)), param) << body;
  }
  EXPECT_EQ(refused_param(parse_openai(R"({"prompt": "Hi", "chat_template_kwargs": {}})", limits,
                                       false)),
            "chat_template_kwargs");
  auto tok = tokenize_json(R"({"prompt": "Hi", "chat_template_kwargs": {"x": 1}})", limits);
  ASSERT_TRUE(std::holds_alternative<ApiError>(tok));
  EXPECT_EQ(std::get<ApiError>(tok).param, "chat_template_kwargs");
  auto tok_chat = tokenize_json(R"({"messages": [{"role": "user", "content": "Hi"}],
                                    "chat_template_kwargs": {"x": 1}})",
                                limits);
  EXPECT_TRUE(std::holds_alternative<nlohmann::json>(tok_chat));
}

}  // namespace
}  // namespace kvrt::api
