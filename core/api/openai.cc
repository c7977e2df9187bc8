#include "core/api/openai.h"

#include <string>
#include <utility>

#include "core/api/body.h"
#include "core/api/generate.h"
#include "core/api/logprobs.h"
#include "core/api/prompt.h"
#include "core/text/utf8.h"
#include "core/util/text.h"

namespace kvrt::api {

using nlohmann::json;

namespace {

// The fields OpenAI's completions and chat share, mapped onto /generate's sampling_params so
// one checker serves both APIs.
std::variant<json, ApiError> openai_sampling(const json& j) {
  json sp = json::object();
  for (const auto& item : j.items()) {
    const std::string& k = item.key();
    const json& v = item.value();
    if (k == "max_tokens" || k == "max_completion_tokens") {
      sp["max_new_tokens"] = v;
    } else if (k == "temperature" || k == "top_p" || k == "seed" || k == "stop" || k == "n" ||
               k == "frequency_penalty" || k == "presence_penalty" || k == "top_k" ||
               k == "ignore_eos" || k == "min_p" || k == "repetition_penalty" ||
               k == "logit_bias") {
      sp[k] = v;
    } else if (k == "min_tokens") {
      sp["min_new_tokens"] = v;
    } else if (k == "tools" || k == "tool_choice" || k == "functions" || k == "function_call" ||
               k == "parallel_tool_calls") {
      // "None of them" is accepted; any tool is refused by name.
      const bool none = v.is_null() || (v.is_array() && v.empty()) || v == "none" ||
                        (k == "parallel_tool_calls" && v.is_boolean());
      if (!none) return bad(k, "tools are not supported: kvrt serves text completions only");
    } else if (k == "model" || k == "prompt" || k == "messages" || k == "stream" || k == "user" ||
               k == "stream_options" || k == "logprobs" || k == "echo" || k == "best_of" ||
               k == "response_format" || k == "priority" || k == "top_logprobs" ||
               k == "chat_template_kwargs") {
      // handled by the caller (no_op: best_of 1, response_format text, user, priority)
    } else {
      return bad(k, "unknown field");
    }
  }
  return sp;
}

// OpenAI's finish reasons: "length", or "stop" for a stop token or string (an aborted request
// is an error, openai_abort_error).
const char* openai_finish(const GenerateResult& r) {
  if (!r.finished) return nullptr;
  return r.reason == serve::FinishReason::kLength ? "length" : "stop";
}

// OpenAI's usage over a call's choices; prompt_tokens_details.cached_tokens counts the prompt
// tokens served from the prefix cache.
json usage_json(const std::vector<GenerateResult>& results) {
  int64_t prompt = 0, completion = 0, cached = 0;
  for (const GenerateResult& r : results) {
    if (!r.counts_prompt) {  // another choice of a prompt counted already
      completion += static_cast<int64_t>(r.output_ids.size());
      continue;
    }
    prompt += r.prompt_tokens;
    completion += static_cast<int64_t>(r.output_ids.size());
    cached += r.cached_tokens;
  }
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

}  // namespace

std::variant<GenerateCall, ApiError> read_openai(std::string_view body, const ModelLimits& limits,
                                                 bool chat) {
  auto parsed = read_object(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& j = std::get<json>(parsed);
  auto sampling = openai_sampling(j);
  if (auto* e = std::get_if<ApiError>(&sampling)) return *e;
  bool echo = false;
  if (auto e = read_bool(j, "echo", &echo)) return *e;
  if (echo && chat) return bad("echo", "unknown field (completions take echo)");
  if (echo && j.contains("stream") && j["stream"] == true) {
    return bad("echo", "echo is not supported when streaming yet");
  }
  // Completions: logprobs k (the chosen token's and the k likeliest); chat: logprobs true and
  // top_logprobs k.
  int32_t logprobs = -1;
  if (j.contains("logprobs") && !j["logprobs"].is_null() && j["logprobs"] != false) {
    const json& v = j["logprobs"];
    if (chat) {
      if (!v.is_boolean()) return bad("logprobs", "expected true or false");
      logprobs = 0;
    } else {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
        return bad("logprobs", "expected an integer >= 0, found " + v.dump());
      }
      logprobs = static_cast<int32_t>(v.get<int64_t>());
    }
  }
  if (j.contains("top_logprobs") && !j["top_logprobs"].is_null()) {
    const json& v = j["top_logprobs"];
    if (!chat) return bad("top_logprobs", "unknown field (completions take logprobs: k)");
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
      return bad("top_logprobs", "expected an integer >= 0, found " + v.dump());
    }
    if (logprobs < 0) return bad("top_logprobs", "needs logprobs: true");
    logprobs = static_cast<int32_t>(v.get<int64_t>());
  }
  if (auto e = no_op(j)) return *e;
  bool stream = false, include_usage = false;
  if (auto e = read_bool(j, "stream", &stream)) return *e;
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    const json& so = j["stream_options"];
    if (!stream) return bad("stream_options", "only allowed when stream is true");
    if (!so.is_object()) return bad("stream_options", "expected an object");
    for (auto it = so.begin(); it != so.end(); ++it) {
      if (it.key() != "include_usage") return bad("stream_options." + it.key(), "unknown field");
    }
    if (so.contains("include_usage") && !so["include_usage"].is_null()) {
      if (!so["include_usage"].is_boolean()) {
        return bad("stream_options.include_usage", "expected true or false");
      }
      include_usage = so["include_usage"].get<bool>();
    }
  }
  // The same request as /generate would see it, checked by the same code (a list of prompts
  // streams here, unlike on /generate: its choices are told apart by index).
  json generate = {{"sampling_params", std::get<json>(sampling)}};
  std::vector<ChatMessage> messages;
  text::TemplateVariables variables;
  if (chat) {
    auto read = read_chat_messages(j);
    if (auto* e = std::get_if<ApiError>(&read)) return *e;
    messages = std::get<std::vector<ChatMessage>>(std::move(read));
    if (auto e = check_conversation(messages, limits)) return *e;
    if (auto e = template_variables(j, &variables)) return *e;
  } else {
    if (j.contains("chat_template_kwargs")) {
      return bad("chat_template_kwargs", "is for chat (/v1/chat/completions): a completion's "
                                         "prompt is not rendered by a template");
    }
    if (!j.contains("prompt") || j["prompt"].is_null()) return bad("prompt", "missing");
    // OpenAI's four shapes: a string, a list of strings, a list of ids, a list of id lists.
    const json& p = j["prompt"];
    const bool texts = p.is_array() && !p.empty() && p[0].is_string();
    const bool id_lists = p.is_array() && !p.empty() && p[0].is_array();
    if (p.is_string() || texts) {
      generate["text"] = p;
    } else if (p.is_array() && !p.empty() && (p[0].is_number() || id_lists)) {
      generate["input_ids"] = p;
    } else {
      return bad("prompt", "expected a string, a list of strings, a list of token ids or a "
                           "list of lists of token ids");
    }
  }
  auto call = chat ? read_generate_fields(generate.dump(), limits)
                   : read_generate(generate.dump(), limits);
  if (auto* e = std::get_if<ApiError>(&call)) {
    // Name the OpenAI field, not the /generate one it was mapped to.
    return renamed(*e, {{"sampling_params.max_new_tokens", "max_tokens"},
                        {"sampling_params.min_new_tokens", "min_tokens"},
                        {"sampling_params.", ""},
                        {"input_ids", chat ? "messages" : "prompt"},
                        {"text", chat ? "messages" : "prompt"}});
  }
  GenerateCall c = std::get<GenerateCall>(std::move(call));
  c.dialect = chat ? Dialect::kChat : Dialect::kCompletions;
  c.messages = std::move(messages);
  c.template_variables = std::move(variables);
  const bool length_given =
      (j.contains("max_tokens") && !j["max_tokens"].is_null()) ||
      (j.contains("max_completion_tokens") && !j["max_completion_tokens"].is_null());
  if (!length_given && chat) {
    c.length_from_context = true;  // the rest of the context, once the prompt is tokenized
  } else if (!length_given) {
    c.max_new_tokens = limits.defaults.completions_max_tokens;
  }
  c.stream = stream;
  c.include_usage = include_usage;
  c.sampling.logprobs = logprobs;
  // echo: the answer starts with the prompt, and its log-probabilities with the prompt's.
  c.echo = echo;
  if (echo && logprobs >= 0) c.sampling.prompt_logprobs_from = 0;
  if (j.contains("best_of") && !j["best_of"].is_null()) {
    const json& b = j["best_of"];
    if (!b.is_number_integer() || b.get<int64_t>() < 1 || b.get<int64_t>() > kMaxChoices) {
      return bad("best_of", "expected an integer from 1 to " + std::to_string(kMaxChoices) +
                                ", found " + b.dump());
    }
    c.best_of = static_cast<int32_t>(b.get<int64_t>());
    if (c.best_of < c.n) return bad("best_of", "must be at least n (" + std::to_string(c.n) + ")");
    if (c.best_of > c.n && stream) {
      return bad("best_of", "best_of > n cannot stream: the best are known only at the end");
    }
  }
  if (j.contains("model") && j["model"].is_string()) c.model = j["model"].get<std::string>();
  return c;
}

std::variant<GenerateCall, ApiError> parse_openai(std::string_view body, const ModelLimits& limits,
                                                  bool chat) {
  auto call = read_openai(body, limits, chat);
  if (auto* c = std::get_if<GenerateCall>(&call)) {
    if (auto e = tokenize_prompts(c, limits)) return *e;
  }
  return call;
}

json openai_json(const GenerateCall& call, const std::vector<GenerateResult>& results,
                 const std::string& id, int64_t created) {
  const bool chat = call.dialect == Dialect::kChat;
  json choices = json::array();
  for (size_t i = 0; i < results.size(); ++i) {
    const GenerateResult& r = results[i];
    json choice = {{"index", i}};
    const char* finish = openai_finish(r);
    choice["finish_reason"] = finish ? json(finish) : json(nullptr);
    const bool logprobs = call.sampling.logprobs >= 0;
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", r.text}};
      choice["logprobs"] = logprobs ? chat_logprobs(call, r.logprobs) : json();
    } else if (call.echo) {
      // The prompt's text first (as given, or its ids decoded) and, with logprobs, its tokens
      // first: the first with no log-probability, nothing being before it.
      const size_t prompt = i / static_cast<size_t>(std::max(call.n, int32_t{1}));
      const std::string prompt_text = prompt < call.prompt_texts.size() ? call.prompt_texts[prompt]
                                      : call.tokenizer != nullptr
                                          ? call.tokenizer->decode(call.prompts[prompt])
                                          : "";
      choice["text"] = prompt_text + r.text;
      if (logprobs) {
        json head = completions_logprobs(call, r.prompt_logprobs, 0);
        const std::string first = token_text(call, r.first_prompt_token);
        size_t offset = text::utf8_characters(first);
        for (const json& t : head["tokens"]) offset += text::utf8_characters(t.get<std::string>());
        json tail = completions_logprobs(call, r.logprobs, offset);
        json all = {{"tokens", json::array({first})},
                    {"token_logprobs", json::array({nullptr})},
                    {"top_logprobs", json::array({nullptr})},
                    {"text_offset", json::array({0})}};
        size_t shift = text::utf8_characters(first);
        for (const json* part : {&head, &tail}) {
          for (const char* key : {"tokens", "token_logprobs", "top_logprobs"}) {
            for (const json& v : (*part)[key]) all[key].push_back(v);
          }
        }
        for (const json& o : head["text_offset"]) {
          all["text_offset"].push_back(o.get<size_t>() + shift);
        }
        for (const json& o : tail["text_offset"]) all["text_offset"].push_back(o);
        choice["logprobs"] = std::move(all);
      } else {
        choice["logprobs"] = nullptr;
      }
    } else {
      choice["text"] = r.text;
      choice["logprobs"] = logprobs ? completions_logprobs(call, r.logprobs, 0) : json();
    }
    choices.push_back(choice);
  }
  return {{"id", id},           {"object", chat ? "chat.completion" : "text_completion"},
          {"created", created}, {"model", call.model},
          {"choices", choices}, {"usage", usage_json(results)}};
}

json openai_chunk(const GenerateCall& call, const GenerateResult& r, const std::string& delta,
                  const std::string& id, int64_t created, size_t index,
                  std::span<const sampling::SampledLogprobs> logprobs, size_t text_offset) {
  const bool chat = call.dialect == Dialect::kChat;
  json choice = {{"index", index}};
  const char* finish = openai_finish(r);
  choice["finish_reason"] = finish ? json(finish) : json(nullptr);
  const bool asked = call.sampling.logprobs >= 0;
  if (chat) {
    choice["delta"] = {{"content", delta}};
    if (r.output_ids.size() <= 1 && !r.finished) choice["delta"]["role"] = "assistant";
    choice["logprobs"] = asked ? chat_logprobs(call, logprobs) : json();
  } else {
    choice["text"] = delta;
    choice["logprobs"] = asked ? completions_logprobs(call, logprobs, text_offset) : json();
  }
  json chunk = {{"id", id},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created},
                {"model", call.model},
                {"choices", json::array({choice})}};
  if (call.include_usage) chunk["usage"] = nullptr;
  return chunk;
}

json openai_usage_chunk(const GenerateCall& call, const std::vector<GenerateResult>& results,
                        const std::string& id, int64_t created) {
  const bool chat = call.dialect == Dialect::kChat;
  json chunk = {{"id", id},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created},
                {"model", call.model},
                {"choices", json::array()}};
  chunk["usage"] = usage_json(results);
  return chunk;
}

ApiError openai_abort_error(const GenerateResult& r) {
  if (r.reason == serve::FinishReason::kEngineFailure) {
    return ApiError{500, r.message, "", "server_error"};
  }
  return ApiError{503, "the request was aborted: " + r.message, "", "request_aborted"};
}

}  // namespace kvrt::api
