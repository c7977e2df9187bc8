#include "core/api/responses.h"

#include <string>
#include <utility>

#include "core/api/body.h"
#include "core/api/generate.h"
#include "core/api/prompt.h"

namespace kvrt::api {

using nlohmann::json;

std::variant<GenerateCall, ApiError> read_responses(std::string_view body,
                                                    const ModelLimits& limits) {
  auto parsed = read_object(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& j = std::get<json>(parsed);
  if (auto e = unknown_field(j, {"model", "input", "instructions", "max_output_tokens",
                                 "temperature", "top_p", "stream", "user", "metadata", "store",
                                 "tools", "tool_choice", "parallel_tool_calls", "text",
                                 "reasoning", "previous_response_id", "truncation", "include",
                                 "service_tier", "background", "ignore_eos"})) {
    return *e;
  }
  static const FieldRule kRefusals[] = {
      {"tools", [](const json& v) { return v.is_array() && v.empty(); },
       "tools are not supported: kvrt serves text responses only"},
      {"tool_choice", [](const json& v) { return v == "none" || v == "auto"; },
       "tools are not supported"},
      {"reasoning", [](const json& v) { return v.is_object() && v.empty(); },
       "reasoning options are not supported"},
      {"previous_response_id", never,
       "responses are not stored, so none can be continued: send the conversation in input"},
      {"store", [](const json& v) { return v == false; },
       "responses are not stored: send store: false (and the conversation in input)"},
      {"background", [](const json& v) { return v == false; }, "background responses are not "
                                                              "supported"},
      {"truncation", [](const json& v) { return v == "disabled"; },
       "only \"disabled\" is supported: a conversation too long for the context is refused"},
      {"include", [](const json& v) { return v.is_array() && v.empty(); },
       "nothing can be included"},
      {"parallel_tool_calls", [](const json& v) { return v.is_boolean(); }, "expected a boolean"},
      {"user", [](const json& v) { return v.is_string(); }, "expected a string"},
      {"metadata", [](const json& v) { return v.is_object(); }, "expected an object"},
      {"service_tier", [](const json& v) { return v.is_string(); }, "expected a string"},
  };
  if (auto e = refused_field(j, kRefusals)) return *e;
  if (j.contains("text") && !j["text"].is_null()) {
    const json& t = j["text"];
    const bool text_format = t.is_object() && (!t.contains("format") ||
                                                (t["format"].is_object() &&
                                                 t["format"].contains("type") &&
                                                 t["format"]["type"] == "text"));
    if (!text_format) {
      return bad("text.format", "only {\"type\": \"text\"}: constrained decoding is not "
                                "built yet");
    }
  }
  // The conversation as chat messages: instructions first, as a system message.
  json messages = json::array();
  if (j.contains("instructions") && !j["instructions"].is_null()) {
    if (!j["instructions"].is_string()) return bad("instructions", "expected a string");
    messages.push_back({{"role", "system"}, {"content", j["instructions"]}});
  }
  if (!j.contains("input") || j["input"].is_null()) return bad("input", "missing");
  const json& input = j["input"];
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
  } else if (input.is_array() && !input.empty()) {
    for (size_t i = 0; i < input.size(); ++i) {
      const json& item = input[i];
      const std::string at = "input[" + std::to_string(i) + "]";
      if (!item.is_object()) return bad(at, "expected a message {role, content}");
      // (A type that is not a string is no type kvrt knows: refused below by name.)
      const std::string type = !item.contains("type") ? "message"
                               : item["type"].is_string() ? item["type"].get<std::string>()
                                                          : item["type"].dump();
      if (type != "message") {
        return bad(at + ".type", "'" + type + "' items are not supported (only messages: no "
                                 "tools or reasoning)");
      }
      if (!item.contains("role") || !item["role"].is_string()) {
        return bad(at + ".role", "expected user, assistant, system or developer");
      }
      std::string role = item["role"];
      if (role == "developer") role = "system";  // the chat templates know system
      if (!item.contains("content")) return bad(at + ".content", "missing");
      auto content = text_content(item["content"], at + ".content", {"input_text", "output_text"},
                                  " (only input_text and output_text: a text model)",
                                  /*strict=*/false);
      if (auto* e = std::get_if<ApiError>(&content)) return *e;
      messages.push_back({{"role", role}, {"content", std::get<std::string>(content)}});
    }
  } else {
    return bad("input", "expected a string or a non-empty list of messages");
  }
  // The Responses API has no empty answer (OpenAI's floor is 16 tokens): 0 stays refused there.
  if (j.contains("max_output_tokens") && j["max_output_tokens"].is_number_integer() &&
      j["max_output_tokens"].get<int64_t>() < 1) {
    return bad("max_output_tokens",
               "expected an integer >= 1, found " + j["max_output_tokens"].dump());
  }
  json sp = json::object();
  for (auto [from, to] : {std::pair{"max_output_tokens", "max_new_tokens"},
                          std::pair{"temperature", "temperature"}, std::pair{"top_p", "top_p"},
                          std::pair{"ignore_eos", "ignore_eos"}}) {
    if (j.contains(from) && !j[from].is_null()) sp[to] = j[from];
  }
  bool stream = false;
  if (auto e = read_bool(j, "stream", &stream)) return *e;
  auto read = read_chat_messages(json{{"messages", messages}});
  std::optional<ApiError> refused;
  if (auto* e = std::get_if<ApiError>(&read)) {
    refused = *e;
  } else {
    refused = check_conversation(std::get<std::vector<ChatMessage>>(read), limits);
  }
  if (refused) {
    ApiError error = *refused;
    if (error.param.rfind("messages", 0) == 0) error.param = "input";
    return error;
  }
  auto call = read_generate_fields(json{{"sampling_params", sp}}.dump(), limits);
  if (auto* e = std::get_if<ApiError>(&call)) {
    return renamed(*e, {{"sampling_params.max_new_tokens", "max_output_tokens"},
                        {"sampling_params.", ""}});
  }
  GenerateCall c = std::get<GenerateCall>(std::move(call));
  c.dialect = Dialect::kResponses;
  c.messages = std::get<std::vector<ChatMessage>>(std::move(read));
  // Unset: the rest of the context, once the prompt is tokenized.
  c.length_from_context = !j.contains("max_output_tokens") || j["max_output_tokens"].is_null();
  c.stream = stream;
  if (j.contains("model") && j["model"].is_string()) c.model = j["model"].get<std::string>();
  if (j.contains("instructions") && j["instructions"].is_string()) {
    c.instructions = j["instructions"].get<std::string>();
  }
  if (j.contains("metadata") && j["metadata"].is_object()) c.metadata = j["metadata"];
  c.max_tokens_given = j.contains("max_output_tokens") && !j["max_output_tokens"].is_null();
  return c;
}

std::variant<GenerateCall, ApiError> parse_responses(std::string_view body,
                                                     const ModelLimits& limits) {
  auto call = read_responses(body, limits);
  if (auto* c = std::get_if<GenerateCall>(&call)) {
    if (auto e = tokenize_prompts(c, limits)) return *e;
  }
  return call;
}

json responses_event(const std::string& type, int64_t sequence, json fields) {
  fields["type"] = type;
  fields["sequence_number"] = sequence;
  return fields;
}

std::string sse_event(const json& event) {
  return "event: " + event["type"].get<std::string>() + "\ndata: " + to_text(event) + "\n\n";
}

json responses_json(const GenerateCall& call, const GenerateResult& r, const std::string& id,
                    int64_t created) {
  const bool done = r.finished;
  const bool incomplete = done && r.reason == serve::FinishReason::kLength;
  json content = json::array();
  if (done) {
    content.push_back({{"type", "output_text"}, {"text", r.text}, {"annotations", json::array()}});
  }
  json output = json::array();
  if (done) {
    output.push_back({{"type", "message"},
                      {"id", "msg_" + id.substr(id.find('_') + 1)},
                      {"status", incomplete ? "incomplete" : "completed"},
                      {"role", "assistant"},
                      {"content", content}});
  }
  const int64_t completion = static_cast<int64_t>(r.output_ids.size());
  json usage = nullptr;
  if (done) {
    usage = {{"input_tokens", r.prompt_tokens},
             {"input_tokens_details", {{"cached_tokens", r.cached_tokens}}},
             {"output_tokens", completion},
             {"output_tokens_details", {{"reasoning_tokens", 0}}},
             {"total_tokens", r.prompt_tokens + completion}};
  }
  return {
      {"id", id},
      {"object", "response"},
      {"created_at", created},
      {"status", !done        ? "in_progress"
                 : incomplete ? "incomplete"
                              : "completed"},
      {"error", nullptr},
      {"incomplete_details", incomplete ? json{{"reason", "max_output_tokens"}} : json(nullptr)},
      {"instructions", call.instructions.empty() ? json(nullptr) : json(call.instructions)},
      {"max_output_tokens", call.max_tokens_given ? json(call.max_new_tokens) : json()},
      {"model", call.model},
      {"output", output},
      {"parallel_tool_calls", false},
      {"previous_response_id", nullptr},
      {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
      {"store", false},
      {"temperature", call.sampling.temperature},
      {"text", {{"format", {{"type", "text"}}}}},
      {"tool_choice", "none"},
      {"tools", json::array()},
      {"top_p", call.sampling.top_p},
      {"truncation", "disabled"},
      {"usage", usage},
      {"metadata", call.metadata}};
}

}  // namespace kvrt::api
