// The pieces every API of kvrt serve shares: a refusal (ApiError) and its body, what the served
// model allows (ModelLimits), one call as parsed (GenerateCall: SGLang's /generate, OpenAI's
// completions and chat, the Responses API all read into it), a request's state as it is answered
// (GenerateResult), the serving core's refusals in each API's terms, and the JSON text writer.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/api/chat_prompt.h"
#include "core/api/defaults.h"
#include "core/sampling/sampler.h"
#include "core/text/tokenizer.h"
#include "core/serve/request.h"
#include "core/util/status.h"

namespace kvrt::api {

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
  sampling::SamplingParams sampling;
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
  // Chat and the Responses API: the conversation, rendered and tokenized by tokenize_prompts
  // into the one prompt (text prompts are tokenized there too: prompts is empty until then).
  std::vector<ChatMessage> messages;
  // chat_template_kwargs: the chat template's variables besides the messages.
  text::TemplateVariables template_variables;
  // The client set no length: max_new_tokens is the rest of the context once the prompt's
  // length is known (tokenize_prompts; conversation_length).
  bool length_from_context = false;
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
  std::vector<sampling::SampledLogprobs> logprobs;  // one per output id, when asked for
  // The prompt's, from max(prompt_logprobs_from, 1) on, when asked for; and its first token.
  std::vector<sampling::SampledLogprobs> prompt_logprobs;
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

// JSON text of a response: bytes of the generated text that are not valid UTF-8 (a token cut
// in the middle of a character) become U+FFFD rather than failing the answer.
std::string to_text(const nlohmann::json& j);

}  // namespace kvrt::api
