#include "core/api/service.h"

#include <cmath>
#include <utility>

#include "core/api/openai.h"
#include "core/api/responses.h"
#include "core/util/text.h"

namespace kvrt::api {

using nlohmann::json;

Service::Service(ServiceOptions options, serve::StepLoop& loop, ModelLimits limits,
                 ServerInfo info)
    : options_(std::move(options)), loop_(loop), limits_(limits), info_(std::move(info)) {}

Status Service::start() {
  if (!options_.record_trace.empty()) {
    trace_.open(options_.record_trace, std::ios::app);
    if (!trace_) {
      return Status::NotFound("server.record_trace: cannot open '" + options_.record_trace +
                              "' for appending");
    }
  }
  started_ = std::chrono::steady_clock::now();
  return Status::Ok();
}

std::vector<Route> Service::routes() {
  auto at_once = [](Reply (Service::*answer)(), Service* self) -> Handler {
    return [self, answer](const Request&, const Post&) { return Handled{(self->*answer)(), {}}; };
  };
  auto with_body = [](Reply (Service::*answer)(const Request&), Service* self) -> Handler {
    return [self, answer](const Request& request, const Post&) {
      return Handled{(self->*answer)(request), {}};
    };
  };
  const Handler generating = [this](const Request& request, const Post& post) {
    return generate(request, post);
  };
  const Handler model_info = [this](const Request&, const Post&) {
    return Handled{json_reply(200, info_.model_info), {}};
  };
  const Handler server_info = [this](const Request&, const Post&) {
    return Handled{json_reply(200, loop_.snapshot()->description), {}};
  };
  const Handler tokenizing = with_body(&Service::tokenize, this);
  const Handler flush = at_once(&Service::flush_cache, this);
  // SGLang's newer names (/server_info, /model_info) answer as the older ones do.
  return {
      {"POST", "/generate", generating},
      {"POST", "/abort_request", with_body(&Service::abort_request, this)},
      {"GET", "/health", at_once(&Service::health, this)},
      {"GET", "/health_generate",
       [this](const Request&, const Post& post) { return health_generate(post); }},
      {"GET", "/get_model_info", model_info},
      {"GET", "/get_server_info", server_info},
      {"GET", "/model_info", model_info},
      {"GET", "/server_info", server_info},
      {"GET", "/get_load", at_once(&Service::get_load, this)},
      {"GET", "/metrics", at_once(&Service::metrics, this)},
      {"POST", "/v1/completions", generating},
      {"POST", "/v1/chat/completions", generating},
      {"POST", "/v1/responses", generating},
      {"GET", "/v1/models", at_once(&Service::models, this)},
      {"POST", "/flush_cache", flush},
      {"GET", "/flush_cache", flush},
      {"POST", "/tokenize", tokenizing},
      {"POST", "/detokenize", tokenizing},
  };
}

Handled Service::started(std::shared_ptr<Call> call) {
  Reply first = call->start();
  // A refusal ends the exchange at once, and nothing of the call runs.
  if (first.ends()) call.reset();
  return Handled{std::move(first), std::move(call)};
}

// The body read into a call (parse), then the call's own steps: tokenize, submit, answer.
Handled Service::generate(const Request& request, const Post& post) {
  auto parsed = request.path == "/generate"       ? read_generate(request.body, limits_)
                : request.path == "/v1/responses" ? read_responses(request.body, limits_)
                                                  : read_openai(request.body, limits_,
                                                                request.path ==
                                                                    "/v1/chat/completions");
  if (auto* call = std::get_if<GenerateCall>(&parsed); call && call->model.empty()) {
    call->model = info_.model_name;
  }
  if (auto* e = std::get_if<ApiError>(&parsed)) return Handled{error_reply(*e), {}};
  return started(std::make_shared<Call>(*this, std::get<GenerateCall>(std::move(parsed)), post));
}

// One token from BOS (or id 0), through the whole serving path.
Handled Service::health_generate(const Post& post) {
  const int32_t bos = limits_.tokenizer ? limits_.tokenizer->bos_id() : 0;
  GenerateCall call;
  call.prompts = {{bos >= 0 ? bos : 0}};
  call.rids = {""};
  call.max_new_tokens = 1;
  return started(std::make_shared<Call>(*this, std::move(call), post, /*health=*/true));
}

void Service::remember_rid(const std::string& rid, uint64_t id) {
  std::lock_guard lock(rid_mutex_);
  rids_.emplace(rid, id);
}

void Service::forget_rid(const std::string& rid, uint64_t id) {
  std::lock_guard lock(rid_mutex_);
  auto [from, to] = rids_.equal_range(rid);
  for (auto it = from; it != to; ++it) {
    if (it->second == id) {
      rids_.erase(it);
      break;
    }
  }
}

void Service::record(std::chrono::steady_clock::time_point arrival, const GenerateResult& r,
                     const sampling::SamplingParams& sampling) {
  if (!trace_.is_open() || r.output_ids.empty()) return;
  const double at = std::chrono::duration<double>(arrival - started_).count();
  json line = json::object();
  line["timestamp"] = std::round(at * 1e6) / 1e6;
  line["input_len"] = r.prompt_tokens;
  line["output_len"] = r.output_ids.size();
  line["temperature"] = util::shortest_decimal(sampling.temperature);
  line["top_p"] = util::shortest_decimal(sampling.top_p);
  line["top_k"] = sampling.top_k;
  line["min_p"] = util::shortest_decimal(sampling.min_p);
  line["seed"] = sampling.seed;
  if (sampling.frequency_penalty != 0) {
    line["frequency_penalty"] = util::shortest_decimal(sampling.frequency_penalty);
  }
  if (sampling.presence_penalty != 0) {
    line["presence_penalty"] = util::shortest_decimal(sampling.presence_penalty);
  }
  if (sampling.repetition_penalty != 1) {
    line["repetition_penalty"] = util::shortest_decimal(sampling.repetition_penalty);
  }
  std::lock_guard lock(trace_mutex_);
  trace_ << line.dump() << '\n' << std::flush;
}

}  // namespace kvrt::api
