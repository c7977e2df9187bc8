#include "core/api/generate.h"

#include <charconv>
#include <cmath>
#include <optional>
#include <string>
#include <utility>

#include "core/api/body.h"
#include "core/api/logprobs.h"
#include "core/api/prompt.h"
#include "core/text/utf8.h"
#include "core/util/text.h"

namespace kvrt::api {

using nlohmann::json;

namespace {

// The fields of a /generate body; `conversation`: the prompt is a conversation the caller reads
// (chat, the Responses API), and the body has neither text nor input_ids.
std::variant<GenerateCall, ApiError> read_body(std::string_view body, const ModelLimits& limits,
                                               bool conversation) {
  auto parsed = read_object(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& j = std::get<json>(parsed);
  if (auto e = unknown_field(
          j, {"text", "input_ids", "sampling_params", "stream", "rid", "return_logprob",
              "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs", "modalities",
              "lora_path", "return_hidden_states", "image_data", "priority",
              "custom_logit_processor", "bootstrap_host", "bootstrap_port", "bootstrap_room"})) {
    return *e;
  }
  if (auto e = no_op(j)) return *e;
  GenerateCall call;
  call.tokenizer = limits.tokenizer;
  call.sampling = limits.defaults.sampling;
  call.max_new_tokens = limits.defaults.generate_max_new_tokens;
  // SGLang's log-probabilities: return_logprob, top_logprobs_num, return_text_in_logprobs;
  // logprob_start_len -1 (its default) asks for the output's alone.
  bool return_logprob = false;
  if (auto e = read_bool(j, "return_logprob", &return_logprob)) return *e;
  if (auto e = read_bool(j, "return_text_in_logprobs", &call.logprob_text)) return *e;
  if (j.contains("top_logprobs_num") && !j["top_logprobs_num"].is_null()) {
    const json& k = j["top_logprobs_num"];
    if (!k.is_number_integer() || k.get<int64_t>() < 0 || k.get<int64_t>() > INT32_MAX) {
      return bad("top_logprobs_num", "expected an integer >= 0, found " + k.dump());
    }
    if (return_logprob) call.sampling.logprobs = static_cast<int32_t>(k.get<int64_t>());
  }
  if (return_logprob && call.sampling.logprobs < 0) call.sampling.logprobs = 0;
  if (j.contains("logprob_start_len") && !j["logprob_start_len"].is_null()) {
    const json& s = j["logprob_start_len"];
    if (!s.is_number_integer()) return bad("logprob_start_len", "expected an integer");
    // -1: the output's only; p >= 0: the prompt's from position p on as well (checked
    // against the prompt by the serving core).
    if (return_logprob && s.get<int64_t>() >= 0) {
      if (s.get<int64_t>() > INT32_MAX) return bad("logprob_start_len", "too large");
      call.sampling.prompt_logprobs_from = static_cast<int32_t>(s.get<int64_t>());
    }
  }
  const bool has_text = j.contains("text") && !j["text"].is_null();
  const bool has_ids = j.contains("input_ids") && !j["input_ids"].is_null();
  if (conversation) {
    // (rids: one, below)
  } else if (has_text == has_ids) {
    return bad(has_text ? "input_ids" : "text", has_text ? "give text or input_ids, not both"
                                                         : "missing: give text or input_ids");
  }
  if (has_text) {
    const json& t = j["text"];
    std::vector<std::string> texts;
    if (t.is_string()) {
      texts.push_back(t.get<std::string>());
    } else if (t.is_array()) {
      call.batch = true;
      for (size_t i = 0; i < t.size(); ++i) {
        if (!t[i].is_string()) {
          return bad("text[" + std::to_string(i) + "]", "expected a string, found " +
                                                            type_name(t[i]));
        }
        texts.push_back(t[i].get<std::string>());
      }
    } else {
      return bad("text", "expected a string or a list of strings, found " + type_name(t));
    }
    call.text_prompt = true;
    if (limits.tokenizer == nullptr) {
      return bad("text", "the model has no tokenizer: give input_ids");
    }
    // Refused by its size before any of it is tokenized: a text past the bound can never fit.
    for (size_t i = 0; i < texts.size(); ++i) {
      if (limits.max_prompt_bytes > 0 && texts[i].size() > limits.max_prompt_bytes) {
        return bad(call.batch ? "text[" + std::to_string(i) + "]" : "text",
                   std::to_string(texts[i].size()) + " bytes cannot fit the model's context of " +
                       std::to_string(limits.context_length) + " tokens (at most " +
                       std::to_string(limits.max_prompt_bytes) + " bytes)");
      }
    }
    // Tokenized by the call's next step (tokenize_prompts).
    call.prompt_texts = std::move(texts);
  } else if (has_ids) {
    const json& ids = j["input_ids"];
    if (ids.is_array() && !ids.empty() && ids[0].is_array()) {
      call.batch = true;
      for (size_t i = 0; i < ids.size(); ++i) {
        auto one = read_ids(ids[i], "input_ids[" + std::to_string(i) + "]", 0);
        if (auto* e = std::get_if<ApiError>(&one)) return *e;
        call.prompts.push_back(std::move(std::get<std::vector<int32_t>>(one)));
      }
    } else {
      auto one = read_ids(ids, "input_ids", 0);
      if (auto* e = std::get_if<ApiError>(&one)) return *e;
      call.prompts.push_back(std::move(std::get<std::vector<int32_t>>(one)));
    }
  }
  // Prompts read (a text one is tokenized later, by tokenize_prompts).
  const size_t prompts = conversation ? 1
                         : has_text   ? call.prompt_texts.size()
                                      : call.prompts.size();
  if (prompts == 0) return bad(has_text ? "text" : "input_ids", "the batch is empty");
  for (size_t i = 0; i < call.prompts.size(); ++i) {
    if (call.prompts[i].empty()) {
      return bad(std::string(has_text ? "text" : "input_ids") +
                     (call.batch ? "[" + std::to_string(i) + "]" : ""),
                 "the prompt is empty");
    }
  }

  if (j.contains("rid") && !j["rid"].is_null()) {
    const json& rid = j["rid"];
    if (rid.is_string() && !call.batch) {
      call.rids.push_back(rid.get<std::string>());
    } else if (rid.is_array() && call.batch && rid.size() == prompts) {
      for (size_t i = 0; i < rid.size(); ++i) {
        if (!rid[i].is_string()) return bad("rid[" + std::to_string(i) + "]", "expected a string");
        call.rids.push_back(rid[i].get<std::string>());
      }
    } else {
      return bad("rid", call.batch ? "expected a list of strings, one per prompt"
                                   : "expected a string");
    }
  }
  call.rids.resize(prompts);
  if (j.contains("stream")) {
    if (!j["stream"].is_boolean()) return bad("stream", "expected true or false");
    call.stream = j["stream"].get<bool>();
    if (call.stream && call.batch) return bad("stream", "streaming a batch is not supported");
  }

  if (j.contains("sampling_params") && !j["sampling_params"].is_null()) {
    const json& sp = j["sampling_params"];
    if (!sp.is_object()) return bad("sampling_params", "expected an object");
    for (const auto& item : sp.items()) {
      const std::string key = item.key();
      const json& v = item.value();
      const std::string param = "sampling_params." + key;
      if (v.is_null()) continue;
      auto number = [&](double* out) -> std::optional<ApiError> {
        if (!v.is_number()) return bad(param, "expected a number, found " + type_name(v));
        *out = v.get<double>();
        if (!std::isfinite(*out)) return bad(param, "expected a finite number");
        return std::nullopt;
      };
      double x = 0;
      if (key == "max_new_tokens") {
        if (!v.is_number_integer()) return bad(param, "expected an integer, found " + type_name(v));
        if (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t{INT32_MAX}
                                   : v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX) {
          return bad(param, "expected an integer >= 0, found " + v.dump());
        }
        call.max_new_tokens = static_cast<int32_t>(v.get<int64_t>());
      } else if (key == "temperature") {
        if (auto e = number(&x)) return *e;
        call.sampling.temperature = static_cast<float>(x);
      } else if (key == "top_p") {
        if (auto e = number(&x)) return *e;
        call.sampling.top_p = static_cast<float>(x);
      } else if (key == "top_k") {
        if (!v.is_number_integer()) return bad(param, "expected an integer, found " + type_name(v));
        const int64_t k = v.get<int64_t>();
        // SGLang's -1 and kvrt's 0 both mean every token.
        if (k < -1 || k > INT32_MAX) return bad(param, "expected -1, 0 (all) or more");
        call.sampling.top_k = k < 0 ? 0 : static_cast<int32_t>(k);
      } else if (key == "min_p") {
        if (auto e = number(&x)) return *e;
        call.sampling.min_p = static_cast<float>(x);
      } else if (key == "seed" || key == "sampling_seed") {
        // SGLang's name is sampling_seed; OpenAI's (and vLLM's) seed. Both: one seed, twice.
        if (!v.is_number_integer()) return bad(param, "expected an integer, found " + type_name(v));
        const uint64_t seed =
            v.is_number_unsigned() ? v.get<uint64_t>() : static_cast<uint64_t>(v.get<int64_t>());
        if (call.seeded && seed != call.sampling.seed) {
          return bad(param, "seed and sampling_seed differ: give one");
        }
        call.sampling.seed = seed;
        call.seeded = true;
      } else if (key == "ignore_eos") {
        if (!v.is_boolean()) return bad(param, "expected true or false");
        call.ignore_eos = v.get<bool>();
      } else if (key == "stop_token_ids") {
        auto ids = read_ids(v, param, 0);
        if (auto* e = std::get_if<ApiError>(&ids)) return *e;
        call.stop_token_ids = std::get<std::vector<int32_t>>(ids);
      } else if (key == "stop") {
        if (v.is_string()) {
          call.stop.push_back(v.get<std::string>());
        } else if (v.is_array()) {
          for (const json& s : v) {
            if (!s.is_string()) return bad(param, "expected a string or a list of strings");
            call.stop.push_back(s.get<std::string>());
          }
        } else {
          return bad(param, "expected a string or a list of strings");
        }
        // An empty one is the serving core's to refuse (check_request, naming "stop").
      } else if (key == "n") {
        if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > kMaxChoices) {
          return bad(param, "expected an integer from 1 to " + std::to_string(kMaxChoices) +
                                ", found " + v.dump());
        }
        call.n = static_cast<int32_t>(v.get<int64_t>());
      } else if (key == "frequency_penalty") {
        if (auto e = number(&x)) return *e;
        call.sampling.frequency_penalty = static_cast<float>(x);
      } else if (key == "presence_penalty") {
        if (auto e = number(&x)) return *e;
        call.sampling.presence_penalty = static_cast<float>(x);
      } else if (key == "repetition_penalty") {
        if (auto e = number(&x)) return *e;
        call.sampling.repetition_penalty = static_cast<float>(x);
      } else if (key == "min_new_tokens") {
        // Its range (0 to max_new_tokens) is the serving core's to check (check_request's
        // min_tokens, named back as sampling_params.min_new_tokens).
        if (!v.is_number_integer() ||
            (v.is_number_unsigned()
                 ? v.get<uint64_t>() > uint64_t{INT32_MAX}
                 : v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX)) {
          return bad(param, "expected an integer >= 0, found " + v.dump());
        }
        call.sampling.min_tokens = static_cast<int32_t>(v.get<int64_t>());
      } else if (key == "logit_bias") {
        // {"<token id>": bias}, as OpenAI's.
        if (!v.is_object()) return bad(param, "expected an object of token id -> bias");
        for (auto it = v.begin(); it != v.end(); ++it) {
          int64_t id = -1;
          const std::string& k = it.key();
          const auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), id);
          if (ec != std::errc() || end != k.data() + k.size() || id < 0 || id > INT32_MAX) {
            return bad(param, "'" + k + "' is not a token id");
          }
          if (!it.value().is_number() || !std::isfinite(it.value().get<double>())) {
            return bad(param + "." + k, "expected a number");
          }
          call.sampling.logit_bias.emplace_back(static_cast<int32_t>(id),
                                                it.value().get<float>());
        }
      } else if (key == "no_stop_trim") {
        if (!v.is_boolean()) return bad(param, "expected true or false");
        call.no_stop_trim = v.get<bool>();
      } else if (key == "skip_special_tokens" || key == "spaces_between_special_tokens") {
        if (!v.is_boolean()) return bad(param, "expected true or false");
        // The output text always leaves special tokens out, as both default to.
        if (!v.get<bool>()) return bad(param, "only true is supported");
      } else if (key == "json_schema" || key == "regex" || key == "ebnf" ||
                 key == "structural_tag") {
        return bad(param, "constrained decoding is not supported yet");
      } else {
        return bad(param, "unknown sampling parameter");
      }
    }
  }
  if (call.stream && call.n > 1) {
    return bad("sampling_params.n", "streaming n > 1 is not supported on /generate (it is on "
                                    "/v1/completions)");
  }
  return call;
}

}  // namespace

std::variant<GenerateCall, ApiError> read_generate(std::string_view body,
                                                   const ModelLimits& limits) {
  return read_body(body, limits, /*conversation=*/false);
}

std::variant<GenerateCall, ApiError> read_generate_fields(std::string_view body,
                                                          const ModelLimits& limits) {
  return read_body(body, limits, /*conversation=*/true);
}

std::variant<GenerateCall, ApiError> parse_generate(std::string_view body,
                                                    const ModelLimits& limits) {
  auto call = read_generate(body, limits);
  if (auto* c = std::get_if<GenerateCall>(&call)) {
    if (auto e = tokenize_prompts(c, limits)) return *e;
  }
  return call;
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
      for (const sampling::TokenLogprob& t : r.logprobs[i].top) {
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
    for (const sampling::SampledLogprobs& e : r.prompt_logprobs) {
      input.push_back(sglang_tuple(call, e.chosen));
      json alternatives = json::array();
      for (const sampling::TokenLogprob& t : e.top) alternatives.push_back(sglang_tuple(call, t));
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

}  // namespace kvrt::api
