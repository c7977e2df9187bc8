#include "core/api/server_info.h"

namespace kvrt::api {

using nlohmann::json;

std::string kv_cache_dtype(const std::string& store) {
  if (store == "kv_bf16_paged") return "bf16";
  if (store == "kv_fp8_e4m3") return "fp8_e4m3";
  return store;
}

json sglang_server_info(const config::Config& cfg, const serve::ServingCore& core,
                        const std::string& store, const std::string& served_model_name,
                        const RequestDefaults& defaults) {
  const sched::SchedulerOptions& s = core.options().scheduler;
  const sched::Scheduler& scheduler = core.scheduler();
  const uint64_t total = core.max_total_num_tokens();
  const uint64_t used = scheduler.tokens_in_use();
  // One scheduler (SGLang has one per data-parallel rank): its state as SGLang's
  // get_internal_state reports it. No speculative decoding: avg_spec_accept_length is null.
  const json state = {
      {"last_gen_throughput", core.last_gen_throughput()},
      {"#running-req", scheduler.num_running()},
      {"#queue-req", scheduler.num_waiting()},
      {"#token", used},
      {"token_usage", total == 0 ? 0.0 : static_cast<double>(used) / static_cast<double>(total)},
      {"avg_spec_accept_length", nullptr}};
  return {{"served_model_name", served_model_name},
          {"context_length", s.max_context},
          {"mem_fraction_static", cfg.scheduler.mem_fraction_static},
          {"chunked_prefill_size", s.chunked_prefill_size > 0 ? s.chunked_prefill_size : -1},
          {"num_continuous_decode_steps", s.num_continuous_decode_steps},
          {"max_running_requests", s.max_running_requests},
          {"max_total_num_tokens", total},
          {"page_size", s.page_size},
          {"tp_size", cfg.tp.size},
          {"dcp_size", cfg.tp.dcp_size},
          {"kv_cache_dtype", kv_cache_dtype(store)},
          {"internal_states", json::array({state})},
          {"sampling_defaults", defaults_json(defaults)}};
}

}  // namespace kvrt::api
