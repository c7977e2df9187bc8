// What GET /get_server_info (and SGLang's newer /server_info) says in SGLang's own keys, beside
// kvrt's: the ServerArgs an operator greps for (mem_fraction_static, chunked_prefill_size,
// num_continuous_decode_steps, max_running_requests, page_size, tp_size, dcp_size, kv_cache_dtype,
// context_length, served_model_name), max_total_num_tokens, internal_states (one object per
// scheduler, as SGLang's bench_serving.py reads it) and the sampling defaults in force.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/config/config.h"
#include "core/serve/serving_core.h"
#include "core/api/defaults.h"

namespace kvrt::api {

// SGLang's --kv-cache-dtype for a KV store: kv_bf16_paged "bf16", kv_fp8_e4m3 "fp8_e4m3";
// any other store (kv_f32_paged, kv_host_tiered, a plugin of one's own) its own name, since
// SGLang has no word for it.
std::string kv_cache_dtype(const std::string& store);

// The fields above from the configuration, the serving core's options and state (read on the
// step thread, as StepLoop::describe calls it) and the served name; `store` is the KV store's
// plugin name. "sampling_defaults" is defaults_json(defaults).
nlohmann::json sglang_server_info(const config::Config& cfg, const serve::ServingCore& core,
                                  const std::string& store, const std::string& served_model_name,
                                  const RequestDefaults& defaults);

}  // namespace kvrt::api
