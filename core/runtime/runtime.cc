#include "core/runtime/runtime.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include "core/capacity/model_shape.h"
#include "core/capacity/stores.h"
#include "core/model/architecture.h"
#include "core/model/safetensors.h"
#include "core/model/weights.h"
#include "core/plugin/attention.h"
#include "core/plugin/plugin_config.h"
#include "core/sched/page_hash.h"
#include "kernels/cpu/gemm.h"
#include "sdk/conformance/verify.h"

#ifdef KVRT_HAVE_CUDA
#include "core/backend/cuda_backend.h"
#include "core/backend/cuda_memory.h"
#include "core/comm/thread_communicator.h"
#endif
#ifdef KVRT_HAVE_NCCL
#include "core/comm/nccl_group.h"
#endif

namespace kvrt::runtime {

void wire_plugins(plugin::Registry& registry, const config::Config& cfg) {
  registry.add_search_dirs(cfg.plugin_paths);
  registry.set_config_source([&cfg](const std::string& name) -> const toml::table* {
    const toml::table* t = cfg.plugin_table("kv", name);
    return t != nullptr ? t : cfg.plugin_table("attention", name);
  });
}

namespace {

// What the plugins may take through the host's alloc: the KV pools on every rank and, on the
// CPU, a MiB each for workspaces; on a GPU the plugins' workspaces (attention plans, split
// partials) come from the reserve mem_fraction_static leaves for activations.
void set_device_budget(plugin::Registry& registry, const Runtime& rt, int tp) {
  const uint64_t workspaces =
      rt.geometry.device.kind == KVRT_DEVICE_CPU ? uint64_t{1} << 20 : rt.budget.reserve();
  registry.memory().set_device_budget((rt.plan.kv_budget + workspaces) * tp);
}

// The free memory of the configured CUDA device (device.ordinal), for the first plan; each
// rank's own device is read again when its backend is made (make_backend below).
Result<uint64_t> cuda_free_memory(const config::Config& cfg) {
#ifdef KVRT_HAVE_CUDA
  Result<backend::CudaDeviceInfo> info = backend::cuda_device_info(cfg.device.ordinal);
  if (!info.ok()) return info.status();
  spdlog::info("CUDA device {}: {}, {:.2f} GiB free of {:.2f} GiB", cfg.device.ordinal, info->name,
               static_cast<double>(info->free_bytes) / (1 << 30),
               static_cast<double>(info->total_bytes) / (1 << 30));
  return info->free_bytes;
#else
  (void)cfg;
  return Status::Unsupported(
      "device.kind = \"cuda\": this build has no CUDA backend (the CUDA toolkit was not found "
      "when it was configured: KVRT_CUDA is off)");
#endif
}

#ifdef KVRT_HAVE_CUDA
// The plugins' device and pinned memory on a GPU; lives as long as the process, as plugins do.
backend::CudaMemory& cuda_memory() {
  static backend::CudaMemory memory;
  return memory;
}

// DESIGN.md's rule on a GPU, once the weights are on it: kv_budget = free_after_weights -
// free_at_start * (1 - mem_fraction_static), free_at_start capped by [device] memory, on each of
// this process's devices; the tightest decides. The weights' figure becomes what they took
// (the backend's copies, scratch and cuBLAS's workspace included), and the plan, its report and
// the plugins' device budget follow.
Result<uint64_t> replan_after_weights(Runtime& rt, const config::Config& cfg,
                                      plugin::Registry& registry,
                                      const plugin::LoadedPlugin& store,
                                      const std::map<int, uint64_t>& free_before, int tp) {
  std::optional<capacity::StoreCapacity> tightest;
  capacity::Budget tightest_budget;
  for (const auto& [device, before] : free_before) {
    Result<backend::CudaDeviceInfo> after = backend::cuda_device_info(device);
    if (!after.ok()) return after.status();
    capacity::Budget b = rt.budget;
    b.device_memory = std::min(cfg.device.memory_bytes, before);
    b.weights_per_rank = before > after->free_bytes ? before - after->free_bytes : 0;
    capacity::StoreCapacity c =
        capacity::store_capacity(store, cfg.plugin_table("kv", store.name), rt.geometry, b, rt.dcp);
    if (!c.error.ok()) {
      return c.error.WithContext("CUDA device " + std::to_string(device) +
                                 " once the weights are loaded");
    }
    spdlog::info("CUDA device {}: the weights took {:.2f} GiB (planned {:.2f} GiB)", device,
                 static_cast<double>(b.weights_per_rank) / (1 << 30),
                 static_cast<double>(rt.budget.weights_per_rank) / (1 << 30));
    if (!tightest || c.plan.num_pages < tightest->plan.num_pages) {
      tightest = c;
      tightest_budget = b;
    }
  }
  if (!tightest) return rt.plan.num_pages;
  rt.budget = tightest_budget;
  rt.plan = tightest->plan;
  rt.capacity_report = capacity::format_report(*tightest, rt.budget);
  set_device_budget(registry, rt, tp);
  return rt.plan.num_pages;
}

// TP ranks on GPUs: device buffers go between them through NCCL, over this process's threads
// (`group` null) or the MPI group's processes, whose communicators still carry the engine's
// host-side commands. The runtime owns what it makes.
Result<comm::TpGroup*> device_group(Runtime& rt, comm::TpGroup* group, int tp, int first_device) {
#ifdef KVRT_HAVE_NCCL
  if (group == nullptr) {
    rt.thread_group = std::make_unique<comm::ThreadGroup>(tp);
    group = rt.thread_group.get();
  }
  std::vector<int> devices;
  for (int r : group->local_ranks()) {
    Result<int> device = backend::cuda_device_for_rank(first_device, r);
    if (!device.ok()) return device.status();
    devices.push_back(*device);
  }
  Result<std::unique_ptr<comm::NcclGroup>> nccl = comm::NcclGroup::create(*group, devices);
  if (!nccl.ok()) return nccl.status();
  rt.device_group = std::move(*nccl);
  return rt.device_group.get();
#else
  (void)rt, (void)group, (void)tp, (void)first_device;
  return Status::Unsupported(
      "TP over CUDA devices needs NCCL, which was not found in the CUDA toolkit when this build "
      "was configured");
#endif
}
#endif

// What the plan phase hands the load phase.
struct Planned {
  exec::RankPlugins plugins;
  const model::ArchitectureFamily* family = nullptr;
};

// Everything build_runtime checks before it reads or generates weights: the device, the model's
// shape, the plugins and their tables, TP, and the capacity plan. Fills rt's plan fields.
Status plan(const config::Config& cfg, plugin::Registry& registry, Runtime& rt, Planned& out) {
  // The device: the CPU, or CUDA devices when this build has the CUDA backend. A configuration
  // asking for one this build or machine lacks is refused, not run on the CPU without a word.
  uint64_t device_memory = cfg.device.memory_bytes;
  kvrt_device device{sizeof(kvrt_device), KVRT_DEVICE_CPU, 0, 0};
  if (cfg.device.kind == "cuda") {
    Result<uint64_t> free_bytes = cuda_free_memory(cfg);
    if (!free_bytes.ok()) return free_bytes.status().WithContext(cfg.source);
    // DESIGN.md's rule reads the device's free memory at start; [device] memory caps it.
    device_memory = std::min(device_memory, *free_bytes);
    device.kind = KVRT_DEVICE_CUDA;
    device.ordinal = cfg.device.ordinal;
  } else if (cfg.device.kind != "cpu") {
    return Status::Unsupported(cfg.source + ": device.kind = \"" + cfg.device.kind +
                               "\" has no backend in this build; there is: cpu");
  }
  // The shape first: the capacity plan needs only it, so a configuration that cannot fit is
  // refused before any weights are read or generated.
  Result<model::ModelConfig> shape = Status::Internal("unset");
  if (!cfg.model.path.empty()) {
    rt.model_name = cfg.model.path;
    shape = model::parse_hf_config(cfg.model.path + "/config.json");
    if (!shape.ok()) return shape.status();
    // The recommended sampling, read with the shape so a bad file stops the start (and
    // `kvrt config check`) before any weights are read.
    Result<model::GenerationConfig> generation = model::load_generation_config(cfg.model.path);
    if (!generation.ok()) return generation.status();
    rt.generation = std::move(*generation);
  } else {
    rt.model_name = cfg.model.preset;
    shape = model::preset_config(cfg.model.preset);
    if (!shape.ok()) return shape.status().WithContext("model.preset");
  }
  rt.model = *shape;
  if (rt.model.sliding_window > 0) {
    return Status::Unsupported(rt.model_name + ": sliding_window attention (" +
                               std::to_string(rt.model.sliding_window) + ") is not supported yet");
  }

  exec::RankPlugins& plugins = out.plugins;
  Result<const plugin::LoadedPlugin*> store = registry.load_kv_store(cfg.kv.store);
  if (!store.ok()) return store.status().WithContext("kv.store");
  plugins.store = *store;
  // A plugin's table is named after the plugin, also when kv.store gives its file's path.
  plugins.store_config = plugin::as_config(cfg.plugin_table("kv", (*store)->name));
  Result<const plugin::LoadedPlugin*> attention = registry.load(cfg.attention.backend);
  if (!attention.ok()) return attention.status().WithContext("attention.backend");
  if ((*attention)->kind() != KVRT_PLUGIN_ATTENTION) {
    return Status::ConfigError("attention.backend: '" + cfg.attention.backend +
                               "' is not an attention plugin");
  }
  plugins.attention = *attention;
  plugins.attention_config =
      plugin::as_config(cfg.plugin_table("attention", (*attention)->name));
  // The plugins' tables as `kvrt config check` checks them: an unknown key or a value the store
  // refuses is named with its file:line now, not reported later by a callback.
  if (Status s = plugin::check_plugin_tables(registry, cfg); !s.ok()) return s;
  if (cfg.verify_plugins || conformance::verify_requested_by_environment()) {
    std::ostringstream log;
    // The suites run their references on CPU memory: on a GPU they check the store's CPU path
    // and cannot run a device-only attention plugin, which is said rather than skipped quietly.
    const bool on_cpu = device.kind == KVRT_DEVICE_CPU;
    if (Status s = conformance::verify_plugins(registry, *store, on_cpu ? *attention : nullptr, log);
        !s.ok()) {
      return s;
    }
    if (on_cpu) {
      spdlog::info("plugins {} and {} pass the conformance suites", (*store)->name,
                   (*attention)->name);
    } else {
      spdlog::warn("plugin {} passes the conformance suite on CPU memory; {} is not verified on "
                   "the device (the suites run on the CPU; its own tests compare it with attn_cpu)",
                   (*store)->name, (*attention)->name);
    }
  }

  // Weights in bf16 or f32: [model] dtype, or with "auto" the checkpoint's own dtype (presets
  // are bf16 models).
  const bool bf16 = bf16_weights(cfg.model.dtype, !cfg.model.path.empty(), rt.model.torch_dtype);
  rt.bf16_weights = bf16;
  // Activations rounded to bf16 in the products: only where there are bf16 products, on the CPU.
  // "auto" takes it where it pays: bf16 weights on a CPU with the AVX-512 BF16 dot product
  // (1.5x at batch 64, 1.5x a 512-token prompt on synth-76m; docs/performance.md's figures). Elsewhere it
  // would only add a rounding pass, so "auto" keeps the activations in f32 there.
  const std::string& precision = cfg.model.matmul_precision;
  const std::string& quant = cfg.model.quantization;
  // With quantized projections, "medium" is theirs (below) and the other products of f32 weights
  // keep their f32 activations.
  rt.bf16_activations =
      (precision == "medium" && (bf16 || quant == "none")) ||
      (precision == "auto" && bf16 && device.kind == KVRT_DEVICE_CPU &&
       kernels::gemm_isa_supported(kernels::GemmIsa::kAvx512Bf16));
  if (rt.bf16_activations && !bf16) {
    return Status::ConfigError(cfg.source +
                               ": model.matmul_precision = \"medium\" rounds the activations of "
                               "products of bf16 weights, but the weights here are f32 "
                               "(model.dtype = \"" +
                               cfg.model.dtype + "\"); set model.dtype = \"bf16\"");
  }
  if (rt.bf16_activations && device.kind != KVRT_DEVICE_CPU) {
    return Status::Unsupported(
        cfg.source +
        ": model.matmul_precision = \"medium\" is the CPU backend's only; "
        "the CUDA backend multiplies f32-accurate activations (\"highest\")");
  }

  // model.quantization: the projections quantized at load, on the CPU, for either family, from
  // a checkpoint that is not quantized already. Their products take int8 activations (per group
  // of 32, as llama.cpp's Q4_0 x Q8_0) for int4 under "medium", and under "auto" where the CPU
  // multiplies them as integers (AVX-512 VNNI or AVX2: what makes int4 fast); bf16 ones for fp8
  // under "medium"; f32 otherwise.
  if (quant != "none") {
    const std::string key = cfg.source + ": model.quantization = \"" + quant + "\"";
    if (device.kind != KVRT_DEVICE_CPU) {
      return Status::Unsupported(key + " is the CPU backend's only (device.kind = \"" +
                                 cfg.device.kind + "\")");
    }
    if (rt.model.weight_format.quantized()) {
      return Status::ConfigError(key + ": " + rt.model_name +
                                 "/config.json's quantization_config already quantizes its "
                                 "weights (" + rt.model.weight_format.describe() +
                                 "); a checkpoint is quantized once: remove model.quantization");
    }
    using Format = backend::CpuQuantization::Format;
    rt.quantization.format = quant == "int4" ? Format::kInt4 : Format::kFp8;
  }
  // The packed products' activations: those of model.quantization's projections, or of the
  // projections a checkpoint stores as int4 or fp8 blocks, which the CPU keeps as stored.
  using Format = backend::CpuQuantization::Format;
  const model::WeightFormat& stored = rt.model.weight_format;
  const Format held =
      quant != "none" ? rt.quantization.format
      : stored.kind == model::WeightFormat::Kind::kPackedInt && stored.bits == 4 ? Format::kInt4
      : stored.kind == model::WeightFormat::Kind::kFp8Block                      ? Format::kFp8
                                                                                 : Format::kNone;
  if (device.kind == KVRT_DEVICE_CPU) {
    rt.quantization.activations = backend::CpuQuantization::activations_for(held, precision);
  }

  // The architecture family, and whether it shards over this many ranks.
  const int tp = cfg.tp.size;
  Result<const model::ArchitectureFamily*> family = model::find_architecture(rt.model);
  if (!family.ok()) return family.status().WithContext(rt.model_name);
  if (Status s = (*family)->check_tp(rt.model, tp); !s.ok()) return s.WithContext("tp.size");
  out.family = *family;

  // Capacity: the weights, split over the ranks, then the KV pool.
  Result<kvrt_kv_geometry> geometry =
      capacity::kv_geometry(capacity::kv_shape(rt.model), static_cast<uint32_t>(tp),
                            static_cast<uint32_t>(cfg.scheduler.page_size), KVRT_DTYPE_F32);
  if (!geometry.ok()) return geometry.status().WithContext("tp.size");
  kvrt_kv_geometry& g = *geometry;
  // Decode context parallelism: against the model (which ranks hold the same KV), and the
  // attention plugin (it must attend a sequence spread over ranks).
  const int dcp = cfg.tp.dcp_size;
  if (Status s = capacity::check_dcp(capacity::kv_shape(rt.model), static_cast<uint32_t>(tp),
                                     static_cast<uint32_t>(dcp));
      !s.ok()) {
    return Status::ConfigError(cfg.source + ": " + s.message() + " (" + rt.model_name + ")");
  }
  if (dcp > 1 && rt.model.num_attention_heads % tp != 0) {
    return Status::ConfigError(
        cfg.source + ": tp.dcp_size " + std::to_string(dcp) + " needs the same query heads on "
        "every rank, but " + std::to_string(rt.model.num_attention_heads) +
        " heads do not split evenly over tp.size " + std::to_string(tp));
  }
  if (dcp > 1 && !plugin::attends_sharded(*plugins.attention)) {
    return Status::ConfigError(cfg.source + ": tp.dcp_size " + std::to_string(dcp) +
                               ": attention plugin " + plugins.attention->name +
                               " has no plan_sharded / run_lse (ABI 1.4), so it cannot attend a "
                               "sequence whose tokens are spread over ranks");
  }
  rt.dcp.size = static_cast<uint32_t>(dcp);
  rt.dcp.removes = capacity::dcp_removes(capacity::kv_shape(rt.model), static_cast<uint32_t>(tp),
                                         static_cast<uint32_t>(dcp));
  g.device = device;
  rt.budget.device_memory = device_memory;
  // What each rank loads, counted from the checkpoint's headers. A preset, a config.json alone,
  // or a checkpoint the loader will refuse (a missing or misshapen tensor: it names it, after
  // the tokenizer's checks) is planned from the parameter count.
  rt.budget.weights_per_rank = static_cast<uint64_t>(rt.model.weight_bytes(bf16 ? 2 : 4)) / tp;
  rt.budget.weights_source = "the parameter count at " + std::string(bf16 ? "2" : "4") +
                             " bytes each, over " + std::to_string(tp) + " ranks";
  if (!cfg.model.path.empty() && model::SafetensorsCheckpoint::present(cfg.model.path)) {
    Result<model::CheckpointBytes> held = model::checkpoint_bytes_per_rank(
        cfg.model.path, rt.model, tp, bf16 ? 2 : 4, device.kind == KVRT_DEVICE_CPU);
    if (held.ok()) {
      rt.budget.weights_per_rank = held->most();
      rt.budget.weights_source = held->source;
    } else {
      spdlog::debug("weights planned from the parameter count: {}", held.status().message());
    }
  }
  if (quant != "none") {
    const QuantizedWeights q = quantized_weights(rt.model, quant, bf16 ? 2 : 4, tp);
    rt.budget.weights_per_rank = q.per_rank;
    rt.budget.weights_source = q.source;
  }
  rt.budget.mem_fraction_static = cfg.scheduler.mem_fraction_static;
  // The same path `kvrt capacity` and the diagnosis take, so the three agree to the byte. A
  // budget that cannot hold one page is refused here, before the pool is allocated.
  capacity::StoreCapacity planned =
      capacity::store_capacity(*plugins.store, cfg.plugin_table("kv", (*store)->name), g, rt.budget,
                               rt.dcp);
  if (!planned.error.ok()) return planned.error;
  rt.plan = planned.plan;
  rt.capacity_report = capacity::format_report(planned, rt.budget);
  rt.geometry = g;
  set_device_budget(registry, rt, tp);
  return Status::Ok();
}

}  // namespace

Status check_runtime(const config::Config& cfg, plugin::Registry& registry) {
  Runtime rt;
  Planned planned;
  return plan(cfg, registry, rt, planned);
}

Result<Runtime> build_runtime(const config::Config& cfg, plugin::Registry& registry,
                              comm::TpGroup* group) {
  Runtime rt;
  Planned planned;
  if (Status s = plan(cfg, registry, rt, planned); !s.ok()) return s;
  const model::ArchitectureFamily* family = planned.family;
  const int tp = cfg.tp.size;
  const bool bf16 = rt.bf16_weights;
  const kvrt_kv_geometry& g = rt.geometry;

  // The tensors: the architecture family loads its own from the checkpoint or generates a
  // preset's. A tokenizer goes with each.
  std::unique_ptr<model::LoadedWeights> weights;
  if (!cfg.model.path.empty()) {
    Result<std::unique_ptr<text::Tokenizer>> tok = text::load_model_tokenizer(cfg.model.path);
    if (!tok.ok()) return tok.status();
    // An id the model has no row for would fail only when first sampled or embedded.
    if ((*tok)->vocab_size() > rt.model.vocab_size) {
      return Status::ConfigError(text::model_tokenizer_path(cfg.model.path) +
                                 ": the tokenizer has " + std::to_string((*tok)->vocab_size()) +
                                 " pieces, more than the model's vocab_size " +
                                 std::to_string(rt.model.vocab_size) + " (" + rt.model_name +
                                 "/config.json)");
    }
    rt.tokenizer = std::move(*tok);
    // A process that runs one rank of several (MPI) reads only that rank's shard.
    const std::vector<int> local = group != nullptr ? group->local_ranks() : std::vector<int>{};
    const bool one_rank = tp > 1 && local.size() == 1;
    Result<std::unique_ptr<model::LoadedWeights>> loaded =
        family->load(cfg.model.path, one_rank ? local[0] : 0, one_rank ? tp : 1);
    if (!loaded.ok()) return loaded.status();
    weights = std::move(*loaded);
  } else {
    Result<std::unique_ptr<model::LoadedWeights>> preset =
        model::make_preset_weights(cfg.model.preset);
    if (!preset.ok()) return preset.status().WithContext("model.preset");
    weights = std::move(*preset);
    Result<std::unique_ptr<text::Tokenizer>> tok =
        text::make_byte_tokenizer(static_cast<int32_t>(rt.model.vocab_size));
    if (!tok.ok()) return tok.status();
    rt.tokenizer = std::move(*tok);
  }

  exec::EngineOptions options;
  options.tp = tp;
  options.page_size = g.page_size;
  options.dcp_size = static_cast<int>(rt.dcp.size);
  options.num_pages = rt.plan.num_pages;
  options.bf16_weights = bf16;
  options.bf16_activations = rt.bf16_activations;
  options.quantization = rt.quantization;
  if (rt.quantization.format != backend::CpuQuantization::Format::kNone) {
    const bool int4 = rt.quantization.format == backend::CpuQuantization::Format::kInt4;
    const kernels::Activations a = rt.quantization.activations;
    spdlog::info(
        "model.quantization = \"{}\": the projections ({}) quantized at load to {}; kept as "
        "loaded: the embeddings, the norms and the LM head{}; their products' activations {}",
        cfg.model.quantization,
        rt.model.is_mla() ? "q_a, q_b or q, kv_a, o, and the MLPs' and experts' gate, up, down"
                          : "q, k, v, o, gate, up, down",
        int4 ? "int4 (groups of 32, symmetric, bf16 scale amax / 7.5)"
             : "fp8 E4M3 (a scale per output row and 128 inputs)",
        rt.model.is_mla() ? ", the router, and kv_b (MLA's absorbed matrices)" : "",
        a == kernels::Activations::kInt8
            ? std::string("int8 per group of 32 (") + kernels::int4_int8_kernel() + " kernel)"
        : a == kernels::Activations::kBf16 ? std::string("rounded to bf16")
                                           : std::string("in f32"));
  }
  if (bf16 && g.device.kind == KVRT_DEVICE_CPU) {  // which kernel the products run, from cpuid
    spdlog::info(
        "products of bf16 weights: {} kernel, activations {} (model.matmul_precision "
        "= \"{}\")",
        kernels::gemm_isa_name(kernels::gemm_best_isa(rt.bf16_activations)),
        rt.bf16_activations ? "rounded to bf16" : "in f32", cfg.model.matmul_precision);
  }
  options.plugins = planned.plugins;
  options.group = group;
  if (g.device.kind == KVRT_DEVICE_CUDA) {
#ifdef KVRT_HAVE_CUDA
    registry.set_device_memory(&cuda_memory());
    // Threads: rank r on device ordinal + r. One rank per process (mpirun): the ranks of a host
    // share its devices round-robin.
    const int first = cfg.device.ordinal;
    // Each device's free memory before its rank's backend and weights, for size_pool.
    auto free_before = std::make_shared<std::map<int, uint64_t>>();
    options.make_backend = [first, bf16,
                            free_before](int rank) -> Result<std::unique_ptr<backend::Backend>> {
      Result<int> device = backend::cuda_device_for_rank(first, rank);
      if (!device.ok()) return device.status();
      Result<backend::CudaDeviceInfo> info = backend::cuda_device_info(*device);
      if (!info.ok()) return info.status();
      free_before->emplace(*device, info->free_bytes);
      Result<std::unique_ptr<backend::CudaBackend>> backend =
          backend::CudaBackend::create(*device, bf16);
      if (!backend.ok()) return backend.status();
      return std::unique_ptr<backend::Backend>(std::move(*backend));
    };
    options.size_pool = [&rt, &cfg, &registry, free_before, store = planned.plugins.store,
                         tp]() -> Result<uint64_t> {
      return replan_after_weights(rt, cfg, registry, *store, *free_before, tp);
    };
    // TP 1 has no collective over device memory (the threads' one-rank communicator touches
    // none, and the logits need no gather), so it needs no NCCL.
    if (tp > 1) {
      Result<comm::TpGroup*> ranks = device_group(rt, group, tp, first);
      if (!ranks.ok()) return ranks.status().WithContext("tp.size");
      options.group = *ranks;
    }
#endif
  }
  Result<std::unique_ptr<exec::Engine>> engine = exec::Engine::create(*weights, options);
  if (!engine.ok()) return engine.status();
  rt.engine = std::move(*engine);
  if (rt.engine->num_pages() < rt.plan.num_pages) {
    // Another process's device had less room: every rank uses its count (page ids are shared).
    rt.plan.num_pages = rt.engine->num_pages();
    rt.plan.max_total_num_tokens = rt.plan.num_pages * g.page_size * rt.dcp.size;
    rt.capacity_report += "  num pages, least over the TP ranks: " +
                          std::to_string(rt.plan.num_pages) + " (max_total_num_tokens " +
                          std::to_string(rt.plan.max_total_num_tokens) + ")\n";
  }
  return rt;
}

bool bf16_weights(const std::string& dtype, bool checkpoint, const std::string& torch_dtype) {
  if (dtype == "auto") return !checkpoint || torch_dtype == "bfloat16";
  return dtype == "bf16";
}

QuantizedWeights quantized_weights(const model::ModelConfig& model, const std::string& quantization,
                                   int dense_bytes, int tp) {
  const int64_t projections = model.quantized_parameter_count();
  const bool int4 = quantization == "int4";
  backend::CpuQuantization held;
  held.format = int4 ? backend::CpuQuantization::Format::kInt4
                     : backend::CpuQuantization::Format::kFp8;
  const double per = held.bytes_per_weight();
  QuantizedWeights q;
  q.per_rank = static_cast<uint64_t>(
      (static_cast<double>((model.parameter_count() - projections) * dense_bytes) +
       static_cast<double>(projections) * per) /
      tp);
  q.source = "the parameter count: the projections quantized at load to " + quantization + " (" +
             (std::ostringstream() << per).str() + " bytes each), the rest at " +
             std::to_string(dense_bytes) + " bytes each, over " + std::to_string(tp) + " ranks";
  return q;
}

std::string kv_identity(const Runtime& rt) {
  const plugin::KvStore& store = rt.engine->store();
  const kvrt_kv_info& info = store.info();
  return rt.model_name + (rt.bf16_weights ? ":bf16" : ":f32") +
         (rt.bf16_activations ? ":bf16x" : "") +
         // Quantized projections compute other K/V: their pages are not the dense model's.
         (rt.quantization.format == backend::CpuQuantization::Format::kInt4  ? ":int4"
          : rt.quantization.format == backend::CpuQuantization::Format::kFp8 ? ":fp8"
                                                                             : "") +
         (rt.quantization.activations == kernels::Activations::kInt8   ? ":int8x"
          : rt.quantization.activations == kernels::Activations::kBf16 ? ":bf16qx"
                                                                       : "") +
         "|" + store.name() + ":" +
         plugin::dtype_name(info.k_dtype) + "/" + plugin::dtype_name(info.v_dtype) + ":scales" +
         std::to_string(info.scale_mode) + ":" + std::to_string(info.bytes_per_page) + "B|tp" +
         std::to_string(rt.engine->tp()) +
         // A page holds other tokens under context parallelism: its hashes differ too.
         (rt.engine->dcp_size() > 1 ? "|dcp" + std::to_string(rt.engine->dcp_size()) : "");
}

std::vector<metrics::StoreCeiling> store_ceilings(plugin::Registry& registry, const Runtime& rt) {
  std::vector<metrics::StoreCeiling> ceilings;
  for (const capacity::StoreCapacity& c :
       capacity::compare_stores(registry, rt.geometry, rt.budget, rt.dcp)) {
    if (c.error.ok()) ceilings.push_back({c.store, c.plan.max_total_num_tokens, c.host_tier});
  }
  // Decode context parallelism is a lever beside the formats: this store at each tp.dcp_size
  // that removes copies at this TP size.
  for (uint32_t n : capacity::dcp_sizes(capacity::kv_shape(rt.model),
                                        static_cast<uint32_t>(rt.engine->tp()))) {
    if (n == rt.dcp.size) continue;
    ceilings.push_back({"tp.dcp_size=" + std::to_string(n),
                        rt.plan.num_pages * rt.plan.page_size * n, false});
  }
  return ceilings;
}

sched::SchedulerOptions scheduler_options(const config::Config& cfg, const Runtime& rt) {
  sched::SchedulerOptions o;
  const config::Config::Scheduler& s = cfg.scheduler;
  // A page id holds page_size tokens on each rank of a context-parallel group.
  o.page_size = static_cast<uint32_t>(s.page_size) * rt.dcp.size;
  o.num_pages = rt.plan.num_pages;
  o.vocab_size = static_cast<int32_t>(rt.model.vocab_size);
  o.max_context = rt.model.max_position_embeddings;
  o.root_hash = sched::root_hash(kv_identity(rt));
  o.chunked_prefill_size = s.chunked_prefill_size;
  o.max_running_requests = s.max_running_requests;
  o.max_prefill_tokens = s.max_prefill_tokens;
  o.num_continuous_decode_steps = s.num_continuous_decode_steps;
  o.new_token_ratio = s.new_token_ratio;
  o.new_token_ratio_decay = s.new_token_ratio_decay;
  o.min_new_token_ratio = s.min_new_token_ratio;
  o.max_new_tokens_clip = s.max_new_tokens_clip;
  o.longest_prefix_first = s.schedule_policy == "lpm";
  o.log_interval = s.log_interval;
  o.tier_min_load_pages = static_cast<uint64_t>(s.tier_min_load_pages);
  return o;
}

serve::ServingOptions serving_options(const config::Config& cfg, const Runtime& rt,
                                      std::vector<metrics::StoreCeiling> other_stores) {
  serve::ServingOptions o;
  o.scheduler = scheduler_options(cfg, rt);
  o.store = cfg.kv.store;
  o.other_stores = std::move(other_stores);
  o.stream_interval = cfg.server.stream_interval;
  return o;
}

}  // namespace kvrt::runtime
