// The endpoints of kvrt serve answered at once, without generating (service.h): /health,
// /metrics and /get_load read the step loop's snapshot and never wait on it; /abort_request,
// /flush_cache, /v1/models, and vLLM's /tokenize and /detokenize.
#include <utility>

#include "core/api/service.h"
#include "core/api/tokenize.h"
#include "core/metrics/metrics.h"

namespace kvrt::api {

using nlohmann::json;

Reply Service::health() {
  if (loop_.snapshot()->engine_broken) {
    return json_reply(503, error_body({503, "the engine is broken", "", "server_error"}));
  }
  return text_reply(200, "", "text/plain");
}

std::string Service::metrics_text(const std::string& kvrt) const {
  if (options_.metric_names == "kvrt") return kvrt;
  std::string sglang = metrics::renamed_exposition(kvrt, "kvrt:", "sglang:", "model_name",
                                                   info_.model_name);
  return options_.metric_names == "sglang" ? sglang : kvrt + sglang;
}

Reply Service::metrics() {
  return text_reply(200, metrics_text(loop_.snapshot()->prometheus), "text/plain; version=0.0.4");
}

Reply Service::get_load() {
  // SGLang's shape: one entry per data-parallel rank (kvrt has one).
  const std::shared_ptr<const serve::LoopSnapshot> snap = loop_.snapshot();
  return json_reply(200, to_text(json::array({{{"dp_rank", 0},
                                               {"num_reqs", snap->running + snap->waiting},
                                               {"num_running_reqs", snap->running},
                                               {"num_waiting_reqs", snap->waiting},
                                               {"num_tokens", snap->tokens_in_use}}})));
}

Reply Service::abort_request(const Request& request) {
  const json j = json::parse(request.body, nullptr, false);
  if (!j.is_object() || !j.contains("rid") || !j["rid"].is_string()) {
    return json_reply(400, error_body({400, "rid: expected a string", "rid"}));
  }
  std::vector<uint64_t> ids;
  {
    std::lock_guard lock(rid_mutex_);
    auto [from, to] = rids_.equal_range(j["rid"].get<std::string>());
    for (auto it = from; it != to; ++it) ids.push_back(it->second);
  }
  for (uint64_t id : ids) loop_.abort(id, "aborted by /abort_request");
  return json_reply(200, json{{"success", !ids.empty()}}.dump());
}

Reply Service::tokenize(const Request& request) {
  auto answer = request.path == "/tokenize" ? tokenize_json(request.body, limits_)
                                            : detokenize_json(request.body, limits_);
  if (auto* e = std::get_if<ApiError>(&answer)) return error_reply(*e);
  return json_reply(200, to_text(std::get<json>(answer)));
}

Reply Service::flush_cache() {
  // Refused while requests run, as SGLang does: their pages are in the cache.
  Result<uint64_t> flushed = loop_.call([](serve::ServingCore& core) {
    return core.flush_cache();
  });
  if (!flushed.ok()) {
    return json_reply(400, error_body({400, flushed.status().message(), ""}));
  }
  return json_reply(200,
                    json{{"success", true},
                         {"flushed_pages", *flushed},
                         {"message", "the prefix cache is empty; a host tier keeps its copies"}}
                        .dump());
}

Reply Service::models() {
  const json model = {{"id", info_.model_name}, {"object", "model"},
                      {"created", unix_time()}, {"owned_by", "kvrt"}};
  return json_reply(200, to_text(json{{"object", "list"}, {"data", json::array({model})}}));
}

}  // namespace kvrt::api
