// The JSON a call of kvrt serve's API is answered with (api.h, second half): SGLang's
// /generate answers and events, OpenAI's completions, chat and Responses answers and chunks,
// their log-probabilities and usage, and the refusals in each API's terms. The request side --
// reading and checking the bodies -- is api.cc.
#include <algorithm>
#include <charconv>
#include <span>
#include <string>
#include <vector>

#include "core/server/api.h"
#include "core/text/utf8.h"

namespace kvrt::server {

using nlohmann::json;

namespace {

// A token's text beside its log-probability: the id decoded alone, special tokens kept ("" with
// no tokenizer).
std::string token_text(const GenerateCall& call, int32_t id) {
  if (call.tokenizer == nullptr) return "";
  text::DecodeOptions options;
  options.skip_special_tokens = false;
  const int32_t one[] = {id};
  return call.tokenizer->decode(one, options);
}

// OpenAI completions' logprobs object for `entries`, text_offset counted from `offset`.
json completions_logprobs(const GenerateCall& call, std::span<const exec::SampledLogprobs> entries,
                          size_t offset) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
       offsets = json::array();
  for (const exec::SampledLogprobs& e : entries) {
    const std::string text = token_text(call, e.chosen.id);
    tokens.push_back(text);
    token_logprobs.push_back(e.chosen.logprob);
    // The k likeliest and, always, the chosen one (up to k + 1 entries, as OpenAI's).
    json alternatives = json::object();
    for (const exec::TokenLogprob& t : e.top) alternatives[token_text(call, t.id)] = t.logprob;
    alternatives[text] = e.chosen.logprob;
    top.push_back(std::move(alternatives));
    offsets.push_back(offset);
    offset += text::utf8_characters(text);  // Python's len(), as OpenAI counts
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top},
          {"text_offset", offsets}};
}

json chat_logprob_entry(const GenerateCall& call, const exec::TokenLogprob& t) {
  const std::string text = token_text(call, t.id);
  std::vector<int> bytes;
  for (char c : text) bytes.push_back(static_cast<unsigned char>(c));
  return {{"token", text}, {"logprob", t.logprob}, {"bytes", bytes}};
}

// OpenAI chat's logprobs object: {"content": [{token, logprob, bytes, top_logprobs}]}.
json chat_logprobs(const GenerateCall& call, std::span<const exec::SampledLogprobs> entries) {
  json content = json::array();
  for (const exec::SampledLogprobs& e : entries) {
    json entry = chat_logprob_entry(call, e.chosen);
    json top = json::array();
    for (const exec::TokenLogprob& t : e.top) top.push_back(chat_logprob_entry(call, t));
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  return {{"content", content}, {"refusal", nullptr}};
}

// SGLang's (logprob, id, text or null) tuple.
json sglang_tuple(const GenerateCall& call, const exec::TokenLogprob& t) {
  return json::array({t.logprob, t.id, call.logprob_text ? json(token_text(call, t.id)) : json()});
}

// OpenAI's finish reasons: "length", or "stop" for a stop token or string (an aborted request
// is an error, openai_abort_error).
const char* openai_finish(const GenerateResult& r) {
  if (!r.finished) return nullptr;
  return r.reason == serve::FinishReason::kLength ? "length" : "stop";
}

}  // namespace

namespace {

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
                  std::span<const exec::SampledLogprobs> logprobs, size_t text_offset) {
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

namespace {

// generate_json's meta_info.
json generate_meta(const GenerateCall& call, const GenerateResult& r, size_t ids_from) {
  json finish = nullptr;
  if (r.finished) {
    switch (r.reason) {
      case serve::FinishReason::kLength:
        finish = {{"type", "length"}, {"length", r.output_ids.size()}};
        break;
      case serve::FinishReason::kStopToken:
        finish = {{"type", "stop"}, {"matched", r.matched_token}};
        break;
      case serve::FinishReason::kStopString:
        finish = {{"type", "stop"}, {"matched", r.matched_stop}};
        break;
      case serve::FinishReason::kAborted:
      case serve::FinishReason::kEngineFailure:
        finish = {{"type", "abort"}, {"message", r.message}};
        break;
    }
  }
  json meta = {{"id", r.rid},
               {"prompt_tokens", r.prompt_tokens},
               {"completion_tokens", r.output_ids.size()},
               {"cached_tokens", r.cached_tokens},
               {"finish_reason", finish}};
  if (r.finished) meta["e2e_latency"] = r.e2e_latency;
  if (call.sampling.logprobs >= 0) {
    // The output's, from ids_from on as output_ids; the prompt's are not asked for
    // (logprob_start_len -1).
    json chosen = json::array(), top = json::array();
    for (size_t i = std::min(ids_from, r.logprobs.size()); i < r.logprobs.size(); ++i) {
      chosen.push_back(sglang_tuple(call, r.logprobs[i].chosen));
      json alternatives = json::array();
      for (const exec::TokenLogprob& t : r.logprobs[i].top) {
        alternatives.push_back(sglang_tuple(call, t));
      }
      top.push_back(std::move(alternatives));
    }
    meta["output_token_logprobs"] = std::move(chosen);
    meta["output_top_logprobs"] = std::move(top);
    // The prompt's from logprob_start_len on (none when it was -1): position 0, with nothing
    // before it, as (null, id, text).
    json input = json::array(), input_top = json::array();
    if (call.sampling.prompt_logprobs_from == 0) {
      input.push_back(
          json::array({nullptr, r.first_prompt_token,
                       call.logprob_text ? json(token_text(call, r.first_prompt_token)) : json()}));
      input_top.push_back(nullptr);
    }
    for (const exec::SampledLogprobs& e : r.prompt_logprobs) {
      input.push_back(sglang_tuple(call, e.chosen));
      json alternatives = json::array();
      for (const exec::TokenLogprob& t : e.top) alternatives.push_back(sglang_tuple(call, t));
      input_top.push_back(std::move(alternatives));
    }
    meta["input_token_logprobs"] = std::move(input);
    meta["input_top_logprobs"] = std::move(input_top);
  }
  return meta;
}

}  // namespace

json generate_json(const GenerateCall& call, const GenerateResult& r, size_t ids_from,
                   size_t text_from) {
  const std::span<const int32_t> ids =
      std::span<const int32_t>(r.output_ids).subspan(std::min(ids_from, r.output_ids.size()));
  return json{{"text", r.text.substr(std::min(text_from, r.text.size()))},
              {"output_ids", std::vector<int32_t>(ids.begin(), ids.end())},
              {"meta_info", generate_meta(call, r, ids_from)}};
}

std::string generate_event(const GenerateCall& call, const GenerateResult& r,
                           GenerateEventCache* cache) {
  // The ids and the text as they grew since the last event, each piece escaped once. (A text
  // that shrank or is not valid UTF-8 -- whose U+FFFD replacements could differ piecewise --
  // is escaped whole instead.)
  for (size_t i = cache->ids; i < r.output_ids.size(); ++i) {
    if (i > 0) cache->ids_text += ',';
    char digits[16];
    const auto end = std::to_chars(digits, digits + sizeof digits, r.output_ids[i]).ptr;
    cache->ids_text.append(digits, end);
  }
  cache->ids = r.output_ids.size();
  const bool grew = r.text.size() >= cache->text;
  const std::string_view fresh = std::string_view(r.text).substr(grew ? cache->text : 0);
  if (!grew || !cache->valid || !text::valid_utf8(fresh)) {
    const std::string whole = to_text(json(r.text));
    cache->text_json.assign(whole, 1, whole.size() - 2);  // without its quotes
    cache->valid = text::valid_utf8(r.text);
  } else if (!fresh.empty()) {
    const std::string piece = to_text(json(std::string(fresh)));
    cache->text_json.append(piece, 1, piece.size() - 2);
  }
  cache->text = r.text.size();
  // nlohmann's objects are ordered by key: meta_info, output_ids, text.
  std::string event = "{\"meta_info\":";
  event += to_text(generate_meta(call, r, 0));
  event.append(",\"output_ids\":[").append(cache->ids_text).append("],\"text\":\"");
  event.append(cache->text_json).append("\"}");
  return event;
}

void GenerateResult::add(const serve::RequestOutput& out) {
  output_ids.insert(output_ids.end(), out.new_ids.begin(), out.new_ids.end());
  text += out.new_text;
  logprobs.insert(logprobs.end(), out.new_logprobs.begin(), out.new_logprobs.end());
  prompt_logprobs.insert(prompt_logprobs.end(), out.prompt_logprobs.begin(),
                         out.prompt_logprobs.end());
  prompt_tokens = out.prompt_tokens;
  cached_tokens = out.cached_tokens;
  if (!out.finished) return;
  finished = true;
  reason = out.finish_reason;
  matched_token = out.matched_token;
  matched_stop = out.matched_stop;
  message = out.message;
  if (keep_stop && reason == serve::FinishReason::kStopString) text += matched_stop;
}

ApiError openai_abort_error(const GenerateResult& r) {
  if (r.reason == serve::FinishReason::kEngineFailure) {
    return ApiError{500, r.message, "", "server_error"};
  }
  return ApiError{503, "the request was aborted: " + r.message, "", "request_aborted"};
}

ApiError refusal(const Status& status, const GenerateCall& call, size_t prompt) {
  const int code = status.code() == Status::Code::kInvalidArgument ? 400 : 503;
  if (code == 503) return ApiError{503, status.message(), "", "server_overloaded"};
  const std::string& field = status.field();
  const bool openai = call.dialect != Dialect::kGenerate;
  std::string param = field;
  if (field == "input_ids" || field == "batch") {
    param = call.dialect == Dialect::kChat        ? "messages"
            : call.dialect == Dialect::kResponses ? "input"
            : openai                              ? "prompt"
            : call.text_prompt                    ? "text"
                                                  : "input_ids";
    if (call.batch && field == "input_ids") param += "[" + std::to_string(prompt) + "]";
  } else if (field == "max_new_tokens") {
    param = call.dialect == Dialect::kResponses ? "max_output_tokens"
            : openai                            ? "max_tokens"
                                                : "sampling_params.max_new_tokens";
  } else if (field == "min_tokens") {
    param = openai ? "min_tokens" : "sampling_params.min_new_tokens";
  } else if (field == "prompt_logprobs_from") {
    param = openai ? "echo" : "logprob_start_len";
  } else if (field == "logprobs") {
    param = call.dialect == Dialect::kChat ? "top_logprobs"
            : openai                       ? "logprobs"
                                           : "top_logprobs_num";
  } else if (!field.empty() && !openai) {
    param = "sampling_params." + field;
  }
  std::string message = status.message();
  if (!field.empty() && message.rfind(field + ": ", 0) == 0) {
    message = param + message.substr(field.size());
  }
  return ApiError{400, message, param};
}

std::string to_text(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace kvrt::server
