// The composition root: everything a configuration names, put together in order --
// config -> plugins -> capacity plan -> model (shape, weights, tokenizer) -> engine -> serving
// core options. Every subcommand that runs a model (generate, bench, and the coming server)
// starts here; nothing below this folder reads the configuration.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/capacity/capacity.h"
#include "core/capacity/stores.h"
#include "core/config/config.h"
#include "core/exec/engine.h"
#include "core/metrics/diagnosis.h"
#include "core/model/generation_config.h"
#include "core/plugin/registry.h"
#include "core/sched/scheduler.h"
#include "core/serve/serving_core.h"
#include "core/text/tokenizer.h"

namespace kvrt::runtime {

struct Runtime {
  std::string model_name;  // the directory or the preset
  model::ModelConfig model;
  // The model directory's generation_config.json (path "" when it has none, or for a preset):
  // the sampling defaults kvrt serve applies.
  model::GenerationConfig generation;
  bool bf16_weights = false;  // matrices held in bf16 rather than f32
  // x rounded to bf16 in the products: model.matmul_precision = "medium", or "auto" where it
  // resolved to medium
  bool bf16_activations = false;
  // model.quantization: the projections quantized at load, and their products' activations.
  backend::CpuQuantization quantization;
  std::unique_ptr<text::Tokenizer> tokenizer;
  capacity::Budget budget;
  capacity::Plan plan;
  // capacity::format_report() of the store and budget above: every term of the plan, for the
  // start-up log.
  std::string capacity_report;
  // The KV geometry of one rank that the plan is for (what other stores are compared on).
  kvrt_kv_geometry geometry{};
  // Decode context parallelism (tp.dcp_size) and what it removes (capacity::dcp_removes).
  capacity::Dcp dcp;
  // On CUDA with TP > 1, where the ranks run: NCCL (device_group) over this process's threads
  // (thread_group) or the caller's MPI group. Declared before the engine, which uses them.
  std::unique_ptr<comm::TpGroup> thread_group, device_group;
  std::unique_ptr<exec::Engine> engine;
};

// Plugin directories and option tables from the config. Plugin names are unique across kinds,
// so a plugin's table is [kv.<name>] or else [attention.<name>]. `cfg` must outlive `registry`.
void wire_plugins(plugin::Registry& registry, const config::Config& cfg);

// Loads and checks everything in order, failing before the KV pool is allocated when the
// configuration cannot fit (the message gives the shortfall in bytes). `registry` must outlive
// the runtime and already know the config's plugin tables (set_config_source).
// `group` is where the TP ranks run (null: threads of this process); it must outlive the runtime.
Result<Runtime> build_runtime(const config::Config& cfg, plugin::Registry& registry,
                              comm::TpGroup* group = nullptr);
// build_runtime's checks without reading or generating weights and without allocating: the
// device, the model's shape, the plugins and their tables (verified when asked), TP and the
// capacity plan. OK when build_runtime would get as far as loading the weights.
Status check_runtime(const config::Config& cfg, plugin::Registry& registry);

// The ceiling every loadable KV store would give on the runtime's budget and geometry, for the
// diagnosis's "what would X give" (stores that cannot serve the geometry are left out), then
// the runtime's store at every other tp.dcp_size that removes KV copies ("tp.dcp_size=N").
std::vector<metrics::StoreCeiling> store_ceilings(plugin::Registry& registry, const Runtime& rt);

// What the page hashes' root is seeded with: the model (its name and weight dtype) and the KV
// store's format (name, K/V dtypes, scale mode, page bytes, TP size and tp.dcp_size).
std::string kv_identity(const Runtime& rt);

// Whether matrices are held in bf16: model.dtype, or with "auto" a checkpoint's own torch_dtype
// (a preset is a bf16 model).
bool bf16_weights(const std::string& dtype, bool checkpoint, const std::string& torch_dtype);

// model.quantization's weights per rank (the runtime's plan and `kvrt capacity` alike): the
// projections at their packed bytes (int4 0.5625 a weight, fp8 1.03125: exact when each
// projection's inputs are whole groups), the rest at `dense_bytes` each, over `tp` ranks; with
// the report's words for it. `quantization` is "int4" or "fp8".
struct QuantizedWeights {
  uint64_t per_rank = 0;
  std::string source;
};
QuantizedWeights quantized_weights(const model::ModelConfig& model, const std::string& quantization,
                                   int dense_bytes, int tp);

// The scheduler options the [scheduler] table gives for the runtime's model and pool.
sched::SchedulerOptions scheduler_options(const config::Config& cfg, const Runtime& rt);
// The serving core's options: the scheduler's, the store, and the other stores' ceilings.
serve::ServingOptions serving_options(const config::Config& cfg, const Runtime& rt,
                                      std::vector<metrics::StoreCeiling> other_stores);

}  // namespace kvrt::runtime
