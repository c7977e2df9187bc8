// Everything a configuration names, put together: the model (Hugging Face directory or preset)
// and its tokenizer, the KV store and attention plugins, the capacity plan that sizes the KV
// pool from the memory budget, and the engine.
#pragma once

#include <memory>
#include <string>

#include "core/capacity/capacity.h"
#include "core/config/config.h"
#include "core/exec/engine.h"
#include "core/model/tokenizer.h"
#include "core/plugin/registry.h"

namespace kvrt::exec {

struct Runtime {
  std::string model_name;  // the directory or the preset
  model::ModelConfig model;
  bool bf16_weights = false;  // matrices held in bf16 rather than f32
  std::unique_ptr<model::Tokenizer> tokenizer;
  capacity::Budget budget;
  capacity::Plan plan;
  // capacity::format_report() of the store and budget above: every term of the plan, for the
  // start-up log.
  std::string capacity_report;
  // The KV geometry of one rank that the plan is for (what other stores are compared on).
  kvrt_kv_geometry geometry{};
  std::unique_ptr<Engine> engine;
};

// Loads and checks everything in order, failing before the KV pool is allocated when the
// configuration cannot fit (the message gives the shortfall in bytes). `registry` must outlive
// the runtime and already know the config's plugin tables (set_config_source).
Result<Runtime> build_runtime(const config::Config& cfg, plugin::Registry& registry);

}  // namespace kvrt::exec
