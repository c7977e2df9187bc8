// The request and response bodies of kvrt serve's API, apart from the sockets: SGLang's POST
// /generate and OpenAI's completions read into a GenerateCall (the JSON's types and shapes
// checked field by field: a bad one is an ApiError naming it, answered 400), each of its
// prompts then a serve::GenerateRequest whose values the serving core checks (refusal() names
// the core's field in the call's own terms), and the JSON each finished or streamed request is
// answered with, built from its serve::RequestOutputs. Pure functions, so they are tested and
// fuzzed without a server.
#pragma once

#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/exec/sampler.h"
#include "core/model/generation_config.h"
#include "core/serve/request.h"
#include "core/server/chat_prompt.h"
#include "core/text/tokenizer.h"
#include "core/util/status.h"

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

// What a request that leaves a value unset gets, as SGLang's and vLLM's servers give it: the
// model directory's generation_config.json where it says (request_defaults), else temperature 1
// with no top-k, top-p or min-p cut (greedy only when asked for, with temperature 0).
struct RequestDefaults {
  exec::SamplingParams sampling{.temperature = 1.0f};
  // The length: /generate's max_new_tokens (SGLang's 128), completions' max_tokens (OpenAI's and
  // vLLM's 16); chat and the Responses API run to the end of the context (ModelLimits::
  // max_sequence_tokens less the prompt) as OpenAI's, vLLM's and SGLang's do, or at most
  // chat_max_tokens when it is above 0. generation_config.json's max_new_tokens sets all three.
  int32_t generate_max_new_tokens = 128;
  int32_t completions_max_tokens = 16;
  int32_t chat_max_tokens = 0;
  // Where they came from: "<path>/generation_config.json" or kvrt's own (SGLang's and OpenAI's).
  std::string source = "SGLang's and OpenAI's defaults (no generation_config.json)";
};
// The defaults with generation_config.json's values over them (temperature, top_p, top_k, min_p,
// repetition_penalty, max_new_tokens; do_sample false: greedy). `generation.path` "": none.
RequestDefaults request_defaults(const model::GenerationConfig& generation);
// {"temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_new_tokens",
// "completions_max_tokens", "chat_max_tokens" (null: the rest of the context), "source"}: what
// /get_server_info says of them.
nlohmann::json defaults_json(const RequestDefaults& defaults);

// What checking a request needs to know of the served model.
struct ModelLimits {
  const text::Tokenizer* tokenizer = nullptr;
  int32_t vocab_size = 0;
  int64_t context_length = 0;  // max_position_embeddings
  // A text prompt (or a conversation's contents) longer than this many bytes is refused before
  // it is tokenized (prompt_byte_bound); 0: no bound.
  uint64_t max_prompt_bytes = 0;
  // How chat is rendered (chat_prompt.h); nullptr: kvrt's default template.
  const ChatFormat* chat = nullptr;
  // The most tokens, prompt and output, one request can ever hold: the context, or the KV pool
  // when that is smaller (0: the context). A chat that leaves max_tokens unset runs to it.
  int64_t max_sequence_tokens = 0;
  RequestDefaults defaults;
};

// The most bytes of text whose tokens can fit `context_length` tokens: every token's piece is at
// most the longest piece of the vocabulary long (special tokens included), so a longer text
// needs more tokens than the context holds. (A normalizer that deletes text, such as
// SentencePiece's whitespace folding, can make a refused text fit; such a prompt is refused
// anyway, as far longer than any context.)
uint64_t prompt_byte_bound(const text::Tokenizer& tokenizer, int64_t context_length);

// The seed of a prompt's choice (or best_of candidate) `choice`: the call's seed for the first,
// and for the others seeds derived from it, the same ones for the same seed every time.
uint64_t choice_seed(uint64_t seed, size_t choice);

// The most choices (n) or candidates (best_of) one prompt may ask for.
inline constexpr int32_t kMaxChoices = 64;

// Which API a call came through: its answer takes that API's shape.
enum class Dialect { kGenerate, kCompletions, kChat, kResponses };

// One POST /generate call: one prompt, or a batch answered as a list in order.
struct GenerateCall {
  Dialect dialect = Dialect::kGenerate;
  std::string model;  // OpenAI: the "model" the client named, echoed back
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> rids;  // one per prompt; "" when the client gave none
  bool batch = false;             // the prompt was a list: the answer is a list
  bool text_prompt = false;       // text (or messages), not ids
  bool stream = false;            // server-sent events
  int32_t max_new_tokens = 128;
  exec::SamplingParams sampling;
  // The client gave a seed (seed, or /generate's sampling_seed): without one, the server draws
  // a fresh seed for the call, so that unseeded requests are not all the same draw.
  bool seeded = false;
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop;  // stop strings, matched in the decoded output
  bool ignore_eos = false;
  // Choices per prompt (n), and the candidates they are the best of (best_of >= n: the n with
  // the highest cumulative log-probability are answered).
  int32_t n = 1;
  int32_t best_of = 1;
  // sampling_params.no_stop_trim: the answer keeps the stop string that ended it.
  bool no_stop_trim = false;
  // OpenAI streams: stream_options.include_usage, a last chunk with the usage and no choices.
  bool include_usage = false;
  // OpenAI completions' echo: the answer's text starts with the prompt (and its
  // log-probabilities with the prompt's, sampling.prompt_logprobs_from 0).
  bool echo = false;
  std::vector<std::string> prompt_texts;  // the text prompts as given (one per prompt)
  // Log-probabilities are asked for when sampling.logprobs >= 0 (that many top ones); SGLang's
  // return_text_in_logprobs puts each token's text beside them.
  bool logprob_text = false;
  // The Responses API's: echoed in its answer.
  std::string instructions;
  nlohmann::json metadata = nlohmann::json::object();  // the object given, or {}
  bool max_tokens_given = false;  // max_output_tokens was set
  // The served tokenizer (null: none), for the tokens' texts beside their log-probabilities.
  const text::Tokenizer* tokenizer = nullptr;
};

// The body parsed and its shape checked: types, a prompt given exactly once, valid UTF-8, a text
// prompt within max_prompt_bytes, nothing after the JSON (a NUL byte included), numbers a double
// holds (1e309 is refused naming its field). What the body leaves unset is limits.defaults'. The
// values (ids inside the vocabulary, max_new_tokens and the sampling parameters in range, the
// prompt inside the context and the pool) are the serving core's to check
// (ServingCore::check_request), once.
std::variant<GenerateCall, ApiError> parse_generate(std::string_view body,
                                                    const ModelLimits& limits);

// POST /v1/completions (`chat` false: "prompt", a string or a list of token ids) and
// /v1/chat/completions (`chat` true: "messages" through the chat template): OpenAI's fields
// (max_tokens, temperature, top_p, seed, stop, stream, n = 1), checked as parse_generate does.
std::variant<GenerateCall, ApiError> parse_openai(std::string_view body, const ModelLimits& limits,
                                                  bool chat);

// POST /v1/responses, OpenAI's Responses API, its text subset: `input` (a string, or a list of
// messages whose content is a string or input_text / output_text parts), `instructions` (a
// system message first), max_output_tokens, temperature, top_p, stream, through the chat
// template. Tools, reasoning, stored responses (previous_response_id, store true) and formats
// other than text are refused by name.
std::variant<GenerateCall, ApiError> parse_responses(std::string_view body,
                                                     const ModelLimits& limits);

// j["messages"]: a non-empty list of {"role", "content"} strings (OpenAI chat's messages).
std::variant<std::vector<text::ChatMessage>, ApiError> read_chat_messages(const nlohmann::json& j);

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
  serve::FinishReason reason = serve::FinishReason::kLength;
  int32_t matched_token = -1;  // kStopToken
  std::string matched_stop;    // kStopString
  std::string message;         // why it was aborted or failed
  double e2e_latency = 0;
  std::vector<exec::SampledLogprobs> logprobs;  // one per output id, when asked for
  // The prompt's, from max(prompt_logprobs_from, 1) on, when asked for; and its first token.
  std::vector<exec::SampledLogprobs> prompt_logprobs;
  int32_t first_prompt_token = -1;
  bool keep_stop = false;  // GenerateCall::no_stop_trim: a matched stop string ends the text
  bool counts_prompt = true;  // false for a prompt's second and later choices (usage)
  // One more output of its request: its ids and text appended, its end taken.
  void add(const serve::RequestOutput& out);
};

// A refusal of a call's request by the serving core or the step loop (a Status naming the
// core's field) as the call's API names it: "sampling_params.top_p" or "top_p", "input_ids",
// "text", "prompt" or "messages", "max_tokens", with 400 for a request that can never be served
// and 503 for a full queue. `prompt`: the index of the refused prompt in a batch.
ApiError refusal(const Status& status, const GenerateCall& call, size_t prompt = 0);

// {"text", "output_ids", "meta_info": {id, prompt_tokens, completion_tokens, cached_tokens,
// finish_reason, e2e_latency}}, SGLang's shape; finish_reason is null while unfinished, else
// {"type": "length", "length"}, {"type": "stop", "matched": id or string} or {"type": "abort",
// "message"}.
// output_ids holds the ids from `ids_from` on and text the bytes from `text_from` on (0, 0: the
// whole answer so far, as SGLang streams it; a stream with incremental output gives the new
// ones).
// What generate_event kept of a stream's earlier events: the output ids and the text so far,
// already in JSON, so each event adds only what is new.
struct GenerateEventCache {
  size_t ids = 0;  // output ids in ids_text
  std::string ids_text;  // "1,2,3"
  size_t text = 0;       // bytes of the text in text_json
  std::string text_json;  // the text escaped, without quotes
  bool valid = true;      // that text is valid UTF-8 (else it is escaped whole each time)
};
// to_text(generate_json(call, result)) exactly, at a cost that does not grow with the ids and
// text already sent (SGLang's streams carry everything so far in every event).
std::string generate_event(const GenerateCall& call, const GenerateResult& result,
                           GenerateEventCache* cache);

// With log-probabilities asked for, meta_info has SGLang's output_token_logprobs and
// output_top_logprobs as (logprob, id, text or null) tuples, from ids_from on.
nlohmann::json generate_json(const GenerateCall& call, const GenerateResult& result,
                             size_t ids_from = 0, size_t text_from = 0);

// OpenAI's answer for a finished call (`results` in prompt order, none aborted: an aborted one
// is answered with openai_abort_error): a "text_completion" or a "chat.completion" with choices
// whose finish_reason is OpenAI's "stop" or "length", and usage; `created` is the Unix time.
nlohmann::json openai_json(const GenerateCall& call, const std::vector<GenerateResult>& results,
                           const std::string& id, int64_t created);
// An aborted or failed request as OpenAI answers errors: 500 for an engine failure, 503 for an
// abort (shutdown, timeout, /abort_request), with the reason; a stream sends it as an event.
ApiError openai_abort_error(const GenerateResult& result);
// One streamed chunk of choice `index`: `delta` is the text since the last chunk, `logprobs`
// those of the ids since then (completions' text_offset counted from `text_offset`);
// finish_reason when finished; "usage": null when the call asked for usage
// (stream_options.include_usage).
nlohmann::json openai_chunk(const GenerateCall& call, const GenerateResult& result,
                            const std::string& delta, const std::string& id, int64_t created,
                            size_t index, std::span<const exec::SampledLogprobs> logprobs = {},
                            size_t text_offset = 0);
// The last chunk of a stream that asked for usage: no choices, the call's usage.
nlohmann::json openai_usage_chunk(const GenerateCall& call,
                                  const std::vector<GenerateResult>& results,
                                  const std::string& id, int64_t created);

// The Responses API's answer: a "response" object (status "completed", or "incomplete" with
// incomplete_details.reason "max_output_tokens") with one assistant message of output_text,
// and usage (input_tokens, output_tokens, cached tokens). `id` is the response's ("resp_...").
nlohmann::json responses_json(const GenerateCall& call, const GenerateResult& result,
                              const std::string& id, int64_t created);
// A Responses stream's event: {"type", "sequence_number", ...fields}; its SSE text is
// "event: <type>\ndata: <json>\n\n" (sse_event).
nlohmann::json responses_event(const std::string& type, int64_t sequence,
                               nlohmann::json fields);
std::string sse_event(const nlohmann::json& event);

// JSON text of a response: bytes of the generated text that are not valid UTF-8 (a token cut
// in the middle of a character) become U+FFFD rather than failing the answer.
std::string to_text(const nlohmann::json& j);

}  // namespace kvrt::server
