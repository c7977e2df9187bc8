#include "core/api/protocol.h"

#include <algorithm>

namespace kvrt::api {

using nlohmann::json;

std::string error_body(const ApiError& e) {
  json error = {{"message", e.message}, {"type", e.type}, {"code", e.status}};
  error["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  return to_text(json{{"error", error}});
}

uint64_t choice_seed(uint64_t seed, size_t choice) {
  if (choice == 0) return seed;
  // splitmix64 of (seed, choice): choices of nearby seeds share no stream, as seed + j would
  // (seed 7's second choice would be seed 8's first).
  uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (static_cast<uint64_t>(choice) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

uint64_t prompt_byte_bound(const text::Tokenizer& tokenizer, int64_t context_length) {
  size_t longest = 1;
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    longest = std::max(longest, tokenizer.piece(id).size());
  }
  return static_cast<uint64_t>(std::max<int64_t>(context_length, 1)) * longest;
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

}  // namespace kvrt::api
