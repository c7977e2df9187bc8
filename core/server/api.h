// The request and response bodies of kvrt serve's API, apart from the sockets: SGLang's POST
// /generate, checked field by field (a bad one is an ApiError naming it, answered 400), and the
// JSON each finished or streamed request is answered with. Pure functions, so they are tested
// and fuzzed without a server.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/exec/sampler.h"
#include "core/model/tokenizer.h"
#include "core/server/chat_prompt.h"

namespace kvrt::server {

// An answer other than 200: the status and OpenAI's error shape
// {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string param;  // the request field at fault ("sampling_params.top_p"), or ""
  std::string type = "invalid_request_error";
};
std::string error_body(const ApiError& error);

// What checking a request needs to know of the served model.
struct ModelLimits {
  const model::Tokenizer* tokenizer = nullptr;
  int32_t vocab_size = 0;
  int64_t context_length = 0;  // max_position_embeddings
  // How chat is rendered (chat_prompt.h); nullptr: kvrt's default template.
  const ChatFormat* chat = nullptr;
};

// Which API a call came through: its answer takes that API's shape.
enum class Dialect { kGenerate, kCompletions, kChat };

// One POST /generate call: one prompt, or a batch answered as a list in order.
struct GenerateCall {
  Dialect dialect = Dialect::kGenerate;
  std::string model;  // OpenAI: the "model" the client named, echoed back
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> rids;  // one per prompt; "" when the client gave none
  bool batch = false;             // the prompt was a list: the answer is a list
  bool stream = false;            // server-sent events
  int32_t max_new_tokens = 128;
  exec::SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop;  // stop strings, matched in the decoded output
  bool ignore_eos = false;
};

// The body parsed and every field checked: types, a prompt given exactly once and non-empty,
// ids inside the vocabulary, max_new_tokens and the sampling parameters in range, the prompt
// plus max_new_tokens inside the context, valid UTF-8.
std::variant<GenerateCall, ApiError> parse_generate(std::string_view body,
                                                    const ModelLimits& limits);

// How a request ended, as finish_reason.type says it.
enum class Finish { kLength, kStop, kAbort };

// POST /v1/completions (`chat` false: "prompt", a string or a list of token ids) and
// /v1/chat/completions (`chat` true: "messages" through the chat template): OpenAI's fields
// (max_tokens, temperature, top_p, seed, stop, stream, n = 1), checked as parse_generate does.
std::variant<GenerateCall, ApiError> parse_openai(std::string_view body, const ModelLimits& limits,
                                                  bool chat);

// j["messages"]: a non-empty list of {"role", "content"} strings (OpenAI chat's messages).
std::variant<std::vector<ChatMessage>, ApiError> read_chat_messages(const nlohmann::json& j);

// POST /tokenize in vLLM's shape: {"model"?, "prompt": "...", "add_special_tokens"? (default
// true)} or {"model"?, "messages": [...], "add_generation_prompt"? (default true)} rendered by
// the chat template as /v1/chat/completions does, "return_token_strs"? (each id's piece) ->
// {"count", "max_model_len", "tokens", "token_strs"}.
std::variant<nlohmann::json, ApiError> tokenize_json(std::string_view body,
                                                     const ModelLimits& limits);
// POST /detokenize: {"model"?, "tokens": [...]} -> {"prompt": "..."}, special tokens kept as
// transformers' decode does (vLLM's answer).
std::variant<nlohmann::json, ApiError> detokenize_json(std::string_view body,
                                                       const ModelLimits& limits);

// A request's state as it is answered (finished, or so far when streaming).
struct GenerateResult {
  std::string rid;
  std::vector<int32_t> output_ids;
  std::string text;  // the decoded output, cut before a matched stop string
  int32_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  bool finished = false;
  Finish kind = Finish::kLength;
  std::string matched;  // the stop string or stop id that ended it
  std::string message;  // why it was aborted
  double e2e_latency = 0;
};
// {"text", "output_ids", "meta_info": {id, prompt_tokens, completion_tokens, cached_tokens,
// finish_reason, e2e_latency}}, SGLang's shape; finish_reason is null while unfinished.
// output_ids holds the ids from `ids_from` on (a streamed event's new ones).
nlohmann::json generate_json(const GenerateResult& result, size_t ids_from = 0);

// OpenAI's answer for a finished call (`results` in prompt order): a "text_completion" or a
// "chat.completion" with choices and usage; `created` is the Unix time.
nlohmann::json openai_json(const GenerateCall& call, const std::vector<GenerateResult>& results,
                           const std::string& id, int64_t created);
// One streamed chunk: `delta` is the text since the last chunk; finish_reason when finished.
nlohmann::json openai_chunk(const GenerateCall& call, const GenerateResult& result,
                            const std::string& delta, const std::string& id, int64_t created);

// JSON text of a response: bytes of the generated text that are not valid UTF-8 (a token cut
// in the middle of a character) become U+FFFD rather than failing the answer.
std::string to_text(const nlohmann::json& j);

// The text of a request's output as its ids arrive, decoded a few tokens at a time rather than
// whole on every token: each step decodes only the ids since the last emitted character (plus
// the one before, so a decoder's spacing rules see context), and a character whose bytes are
// split across tokens is held back until it is whole, so a streamed delta never carries half
// of one (vLLM's prefix / read offsets). The output is decoded after `context`, the prompt's last
// ids, so that a decoder's rule for a sequence's first piece (a Metaspace decoder dropping its
// space, as transformers' Llama-2 and Mistral tokenizer.json files do) never eats the output's
// first space.
class TextStream {
 public:
  explicit TextStream(const model::Tokenizer* tokenizer, std::vector<int32_t> context = {})
      : tokenizer_(tokenizer), context_(std::move(context)), read_(context_.size()) {}
  // The ids so far (each call one or more longer than the last); returns the text now whole.
  const std::string& update(const std::vector<int32_t>& ids);
  // Every id decoded at once: the exact final text (an unfinished character included).
  std::string finish(const std::vector<int32_t>& ids) const;
  const std::string& text() const { return text_; }

 private:
  // Positions [from, end) of context_ followed by ids.
  std::vector<int32_t> window(const std::vector<int32_t>& ids, size_t from) const;

  const model::Tokenizer* tokenizer_;
  std::vector<int32_t> context_;
  std::string text_;
  // Positions in context_ then the output: [prefix_, read_) were decoded into the end of text_
  // (or are the context).
  size_t prefix_ = 0;
  size_t read_ = 0;
};

// The first byte offset of a stop string in `text`, and which one, or npos.
size_t find_stop(std::string_view text, const std::vector<std::string>& stops,
                 std::string* matched);
// How much of an unfinished output may be streamed: `text` without its longest suffix that is
// the start of a stop string (the rest may yet complete one, and a stop string is never sent),
// as vLLM and SGLang hold it back. A match inside `text` is find_stop's to cut.
size_t stop_safe_length(std::string_view text, const std::vector<std::string>& stops);

}  // namespace kvrt::server
