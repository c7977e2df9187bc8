// kvrt: the command line. Program output goes to stdout, log lines and errors to stderr.
//   kvrt plugins [-v]                         what can be loaded, and why not
//   kvrt config check FILE [--set k=v ...]    validate and print the effective configuration
//   kvrt capacity [--config FILE] [...]       KV capacity of every store for a geometry
//   kvrt generate [--config FILE] --prompt T  one request through the serving core
//   kvrt bench [--config FILE] --workload W   a workload through the serving core, reported
//   kvrt bench ... --matrix KEY=V1,V2         every combination of config values, compared
//   kvrt bench --url URL --workload W         the same workload against a running server
//   kvrt eval [--config FILE] --text F        what each KV store costs in accuracy
//   kvrt serve [--config FILE]                the HTTP server (core/cli/serve.cc)
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include "core/bench/bench.h"
#include "core/bench/bench_http.h"
#include "core/bench/matrix.h"
#include "core/capacity/capacity.h"
#include "core/capacity/model_shape.h"
#include "core/capacity/stores.h"
#include "core/cli/serve.h"
#include "core/cli/tokenize.h"
#include "core/comm/mpi_group.h"
#include "core/config/config.h"
#include "core/eval/calibrate.h"
#include "core/eval/eval.h"
#include "core/model/architecture.h"
#include "core/model/safetensors.h"
#include "core/plugin/plugin_config.h"
#include "core/plugin/registry.h"
#include "core/report/matrix_report.h"
#include "core/model/weights.h"
#include "core/runtime/runtime.h"
#include "core/runtime/start.h"
#include "core/sampling/sampler.h"

namespace kvrt {
namespace {

int fail(const Status& status) {
  std::cerr << "kvrt: " << status.message() << "\n";
  return 1;
}

int run_plugins(bool verbose) {
  plugin::Registry registry;
  std::vector<plugin::LoadFailure> failures = registry.discover();
  std::printf("%-16s %-10s %-8s %-5s %-10s %-19s %s\n", "NAME", "KIND", "VERSION", "ABI", "DTYPES",
              "CAPABILITIES", "PATH");
  for (const plugin::LoadedPlugin* p : registry.loaded()) {
    std::string abi = std::to_string(p->desc.abi_major) + "." + std::to_string(p->desc.abi_minor);
    std::printf("%-16s %-10s %-8s %-5s %-10s %-19s %s\n", p->name.c_str(),
                plugin::kind_name(p->kind()), p->desc.version ? p->desc.version : "-", abi.c_str(),
                p->input_dtype_names().c_str(), p->capabilities().c_str(), p->path.c_str());
    if (verbose) {
      std::printf("    %s\n", p->desc.description ? p->desc.description : "");
      for (const kvrt_option_desc& o : p->options) {
        std::printf("    option %-24s default %-16s %s\n", o.name,
                    o.default_value ? o.default_value : "-", o.help ? o.help : "");
      }
    }
  }
  for (const plugin::LoadFailure& f : failures) std::printf("not loaded: %s\n", f.message.c_str());
  if (registry.loaded().empty()) {
    std::string dirs;
    for (const auto& d : registry.search_dirs()) dirs += " " + d.string();
    std::printf("no plugins found; searched:%s\n", dirs.c_str());
  }
  return 0;
}

int run_config_check(const std::string& path, const std::vector<std::string>& overrides) {
  Result<config::Config> cfg = config::load(path, overrides);
  if (!cfg.ok()) return fail(cfg.status());
  plugin::Registry registry;
  runtime::wire_plugins(registry, *cfg);
  Status s = plugin::check_plugin_tables(registry, *cfg);
  if (!s.ok()) return fail(s);
  std::string text = config::to_toml(*cfg);
  std::cout << text << (text.empty() || text.back() != '\n' ? "\n" : "");
  return 0;
}

struct CapacityArgs {
  std::string model;  // a directory, a config.json, a preset or a named shape
  std::optional<uint32_t> layers, kv_heads, head_dim, v_head_dim, kv_lora_rank, qk_rope_head_dim;
  std::optional<double> weights_gib;  // all ranks
  std::optional<uint32_t> tp, gpus;
  std::string gpu_memory;  // per GPU; "" = [device] memory
};

// The model the file's [model] names, or "" when the file leaves it at its default: the
// default preset is a toy, and `kvrt capacity` alone has always planned for Llama-3-8B.
std::string configured_model(const config::Config& cfg) {
  if (!cfg.model.path.empty()) return cfg.model.path;
  const toml::node* preset = cfg.table().at_path("model.preset").node();
  return preset != nullptr && preset->source().begin.line > 0 ? cfg.model.preset : "";
}

// `model`'s config when it is a directory with a safetensors checkpoint of an architecture kvrt
// runs (whose bytes per rank are then counted from the headers); nullopt otherwise, and the
// weights are derived from the config's parameter count.
std::optional<model::ModelConfig> runnable_checkpoint(const std::string& model) {
  std::error_code ec;
  if (!std::filesystem::is_directory(model, ec) || !model::SafetensorsCheckpoint::present(model)) {
    return std::nullopt;
  }
  Result<model::ModelConfig> config = model::parse_hf_config(model + "/config.json");
  if (!config.ok() || !model::find_architecture(*config).ok()) return std::nullopt;
  return *config;
}

int run_capacity(const std::string& path, const std::vector<std::string>& overrides,
                 const CapacityArgs& args) {
  Result<config::Config> cfg = config::load(path, overrides);
  if (!cfg.ok()) return fail(cfg.status());
  std::string model = !args.model.empty() ? args.model : configured_model(*cfg);
  if (model.empty()) model = "llama3-8b-shape";
  Result<capacity::ModelShape> shape = capacity::read_model_shape(model);
  if (!shape.ok()) return fail(shape.status());

  // Flags override the model's fields one by one; --head-dim alone sets V's too.
  capacity::KvShape kv = shape->kv;
  if (args.layers) kv.layers = *args.layers;
  if (args.kv_heads) kv.kv_heads = *args.kv_heads;
  if (args.head_dim) kv.head_dim = kv.v_head_dim = *args.head_dim;
  if (args.v_head_dim) kv.v_head_dim = *args.v_head_dim;
  if (args.kv_lora_rank) kv.kv_lora_rank = *args.kv_lora_rank;
  if (args.qk_rope_head_dim) kv.qk_rope_head_dim = *args.qk_rope_head_dim;

  const uint32_t tp = args.tp.value_or(static_cast<uint32_t>(cfg->tp.size));
  const uint32_t gpus = args.gpus.value_or(tp);
  if (tp == 0 || gpus == 0 || gpus % tp != 0) {
    return fail(Status::InvalidArgument("--gpus " + std::to_string(gpus) +
                                        " must be a positive multiple of TP " +
                                        std::to_string(tp)));
  }
  capacity::Budget budget;
  budget.device_memory = cfg->device.memory_bytes;
  if (!args.gpu_memory.empty()) {
    std::optional<uint64_t> bytes = config::parse_size(args.gpu_memory);
    if (!bytes || *bytes == 0) {
      return fail(Status::InvalidArgument("--gpu-memory: expected a size such as 80GiB, found '" +
                                          args.gpu_memory + "'"));
    }
    budget.device_memory = *bytes;
  }
  uint64_t weights = 0;
  if (args.weights_gib) {
    // Bounded so the byte count below is a well-defined integer (1 PiB is far beyond any model).
    if (!(*args.weights_gib >= 0 && *args.weights_gib <= (1 << 20))) {
      return fail(
          Status::InvalidArgument("--weights-gib: expected a number of GiB in [0, 1048576], "
                                  "found " +
                                  std::to_string(*args.weights_gib)));
    }
    weights = static_cast<uint64_t>(*args.weights_gib * (1ull << 30));
  } else if (std::optional<model::ModelConfig> config = runnable_checkpoint(model)) {
    // What each rank holds, from the safetensors headers, as the runtime counts it: dense
    // weights in the dtype they are served in, quantized ones packed where the CPU keeps them.
    const int dense = runtime::bf16_weights(cfg->model.dtype, true, config->torch_dtype) ? 2 : 4;
    Result<model::CheckpointBytes> ranks = model::checkpoint_bytes_per_rank(
        model, *config, static_cast<int>(tp), dense, cfg->device.kind == "cpu");
    if (!ranks.ok()) return fail(ranks.status());
    weights = ranks->whole;
    budget.weights_per_rank = ranks->most();
    budget.weights_source = ranks->source;
  } else {
    Result<uint64_t> derived = capacity::weight_bytes(*shape, cfg->model.dtype);
    if (!derived.ok()) return fail(derived.status());
    weights = *derived;
  }
  if (budget.weights_source.empty()) budget.weights_per_rank = weights / tp;
  // model.quantization: the runtime's count (its refusals are the runtime's: kvrt config check).
  if (cfg->model.quantization != "none" && !args.weights_gib) {
    std::optional<model::ModelConfig> config = runnable_checkpoint(model);
    const bool checkpoint = config.has_value();
    if (!config) {
      Result<model::ModelConfig> preset = model::preset_config(model);
      if (preset.ok()) config = *preset;
    }
    if (!config) {
      return fail(Status::Unsupported(
          "model.quantization = \"" + cfg->model.quantization + "\": kvrt capacity counts "
          "quantized projections for a model directory kvrt runs or a preset, not for '" + model +
          "' (give --weights-gib)"));
    }
    const int dense =
        runtime::bf16_weights(cfg->model.dtype, checkpoint, config->torch_dtype) ? 2 : 4;
    const runtime::QuantizedWeights q =
        runtime::quantized_weights(*config, cfg->model.quantization, dense, static_cast<int>(tp));
    weights = q.per_rank * tp;
    budget.weights_per_rank = q.per_rank;
    budget.weights_source = q.source;
  }
  budget.mem_fraction_static = cfg->scheduler.mem_fraction_static;

  Result<kvrt_kv_geometry> g = capacity::kv_geometry(
      kv, tp, static_cast<uint32_t>(cfg->scheduler.page_size), KVRT_DTYPE_BF16);
  if (!g.ok()) return fail(g.status());
  const auto dcp = static_cast<uint32_t>(cfg->tp.dcp_size);
  if (Status s = capacity::check_dcp(kv, tp, dcp); !s.ok()) return fail(s);
  const capacity::Dcp dcp_plan{dcp, capacity::dcp_removes(kv, tp, dcp)};
  plugin::Registry registry;
  runtime::wire_plugins(registry, *cfg);
  std::vector<capacity::StoreCapacity> stores =
      capacity::compare_stores(registry, *g, budget, dcp_plan);

  const bool flags = args.layers || args.kv_heads || args.head_dim || args.v_head_dim ||
                     args.kv_lora_rank || args.qk_rope_head_dim;
  std::string label = "model " + model;
  if (!shape->architecture.empty()) label += " (" + shape->architecture + ")";
  if (flags) label += " with the shape flags";
  const std::string copies = dcp > 1 ? "tp.dcp_size " + std::to_string(dcp) + ": one copy "
                                                 "per group of " + std::to_string(dcp) + " ranks"
                                     : "one copy on every rank";
  if (kv.mla()) {
    std::printf("%s: %u layers, MLA latent %u + rope %u (%s), page %u\n", label.c_str(),
                g->num_layers, kv.kv_lora_rank, kv.qk_rope_head_dim, copies.c_str(),
                g->page_size);
  } else {
    std::printf("%s: %u layers, %u KV heads (%u per rank), head dim %u/%u, page %u\n",
                label.c_str(), g->num_layers, g->total_kv_heads, g->num_kv_heads, g->k_head_dim,
                g->v_head_dim, g->page_size);
  }
  const std::string weights_source =
      args.weights_gib ? "--weights-gib"
      : budget.weights_source.empty()
          ? "from " + model + "'s parameter count, dtype " + cfg->model.dtype
          : budget.weights_source;
  // Which budget it assumed: a default 2 GiB "GPU" makes any real model look as if it cannot fit.
  const std::string memory_source =
      !args.gpu_memory.empty() ? "--gpu-memory"
      : cfg->device.memory_bytes != config::Config{}.device.memory_bytes
          ? "[device] memory of " + cfg->source
          : "[device] memory's default: give --gpu-memory SIZE for your GPU";
  std::printf("%u GPU%s of %s (%s) at TP %u, mem_fraction_static %.2f\n", gpus,
              gpus == 1 ? "" : "s", capacity::format_bytes(budget.device_memory).c_str(),
              memory_source.c_str(), tp, budget.mem_fraction_static);
  std::printf("weights %s, per rank %s: %s\n\n", capacity::bytes_and_exact(weights).c_str(),
              capacity::bytes_and_exact(budget.weights_per_rank).c_str(), weights_source.c_str());
  std::printf("%-16s %10s %12s %12s %22s %8s %8s %8s %14s\n", "STORE", "BYTES/TOK", "PAGE",
              "KV BUDGET", "MAX_TOTAL_NUM_TOKENS", "@1K", "@4K", "@16K", "HOST TIER TOK");
  for (const capacity::StoreCapacity& s : stores) {
    if (!s.error.ok()) {
      std::printf("%-16s %s\n", s.store.c_str(), s.error.message().c_str());
      continue;
    }
    const capacity::Plan& p = s.plan;
    std::printf("%-16s %10llu %12s %12s %22llu %8llu %8llu %8llu %14s\n", s.store.c_str(),
                static_cast<unsigned long long>(p.bytes_per_token()),
                capacity::format_bytes(p.page_bytes).c_str(),
                capacity::format_bytes(p.kv_budget).c_str(),
                static_cast<unsigned long long>(p.max_total_num_tokens),
                static_cast<unsigned long long>(p.concurrent_decodes(1024)),
                static_cast<unsigned long long>(p.concurrent_decodes(4096)),
                static_cast<unsigned long long>(p.concurrent_decodes(16384)),
                !s.host_tier         ? "-"
                : !s.host_tier_sized ? "unknown"
                                     : std::to_string(s.host_tier_tokens).c_str());
  }
  std::printf(
      "\n@N: requests that can decode at once when each holds N tokens of KV.\n"
      "A host tier keeps evicted prefixes for reuse; it does not raise @N.\n");
  if (gpus > tp) {
    std::printf(
        "%u GPUs at TP %u are %u replicas, each with its own KV pool: the node holds %ux "
        "MAX_TOTAL_NUM_TOKENS and %ux @N.\n",
        gpus, tp, gpus / tp, gpus / tp, gpus / tp);
  }
  for (const capacity::StoreCapacity& s : stores) {
    if (s.store != cfg->kv.store || !s.error.ok()) continue;
    // Decode context parallelism, the lever beside the formats: this store at every
    // tp.dcp_size that removes copies at this TP size.
    const std::vector<uint32_t> sizes = capacity::dcp_sizes(kv, tp);
    if (!sizes.empty()) {
      std::printf("\nDecode context parallelism with %s (%s):\n", s.store.c_str(),
                  capacity::dcp_removes(kv, tp, sizes.back()).c_str());
      for (uint32_t n : sizes) {
        capacity::Plan p = s.plan;
        p.dcp_size = n;
        p.max_total_num_tokens = p.num_pages * p.page_size * n;
        std::printf("  tp.dcp_size=%u -> max_total_num_tokens %llu, @1K %llu, @4K %llu, @16K "
                    "%llu%s\n",
                    n, static_cast<unsigned long long>(p.max_total_num_tokens),
                    static_cast<unsigned long long>(p.concurrent_decodes(1024)),
                    static_cast<unsigned long long>(p.concurrent_decodes(4096)),
                    static_cast<unsigned long long>(p.concurrent_decodes(16384)),
                    n == dcp ? " (configured)" : "");
      }
    }
    std::printf("\n%s", capacity::format_report(s, budget).c_str());
  }
  return 0;
}

struct GenerateArgs {
  std::string prompt;
  std::string ids;  // "1,403,407"
  std::string stop;
  bool no_bos = false;
  bool ignore_eos = false;
  bool verbose = false;
  int32_t max_new_tokens = 64;
  sampling::SamplingParams sampling;
};

Result<std::vector<int32_t>> parse_ids(const std::string& text, const char* flag) {
  std::vector<int32_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      size_t used = 0;
      ids.push_back(std::stoi(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      return Status::InvalidArgument(std::string(flag) + ": '" + item + "' is not a token id");
    }
  }
  return ids;
}

int run_generate(const std::string& path, const std::vector<std::string>& overrides,
                 const GenerateArgs& args) {
  Result<std::unique_ptr<runtime::Session>> session = runtime::start(path, overrides);
  if (!session.ok()) return fail(session.status());
  if (!(*session)->leads()) return runtime::follow(**session);
  const config::Config* cfg = &(*session)->cfg;
  runtime::Runtime* rt = &(*session)->rt;
  serve::GenerateRequest request;
  if (!args.ids.empty()) {
    Result<std::vector<int32_t>> ids = parse_ids(args.ids, "--ids");
    if (!ids.ok()) return fail(ids.status());
    request.input_ids = *ids;
  } else {
    request.input_ids = rt->tokenizer->encode(args.prompt, !args.no_bos);
  }
  if (!args.stop.empty()) {
    Result<std::vector<int32_t>> stop = parse_ids(args.stop, "--stop");
    if (!stop.ok()) return fail(stop.status());
    request.stop_token_ids = *stop;
  }
  // --stop replaces the model's EOS ids (which the serving core adds otherwise), as does
  // --ignore-eos.
  request.ignore_eos = args.ignore_eos || !args.stop.empty();
  request.max_new_tokens = args.max_new_tokens;
  request.sampling = args.sampling;
  if (args.verbose) {
    std::fprintf(stderr, "%s", rt->capacity_report.c_str());
    std::fprintf(stderr,
                 "model %s (%s weights), TP %d, kv %s, attention %s; KV pool %llu pages of %u "
                 "tokens (%llu tokens, %llu bytes/token)\n",
                 rt->model_name.c_str(), rt->bf16_weights ? "bf16" : "f32", cfg->tp.size,
                 cfg->kv.store.c_str(), cfg->attention.backend.c_str(),
                 static_cast<unsigned long long>(rt->plan.num_pages), rt->plan.page_size,
                 static_cast<unsigned long long>(rt->plan.max_total_num_tokens),
                 static_cast<unsigned long long>(rt->plan.bytes_per_token()));
  }

  // One request through the same serving core `kvrt bench` and the server use (prefix cache,
  // tier, chunked prefill, the scheduler's checks); its scheduler log lines are for servers.
  serve::ServingOptions options = runtime::serving_options(*cfg, *rt, {});
  options.scheduler.log_interval = 0;
  options.eos_token_ids = rt->model.eos_token_ids;
  serve::ServingCore core(options, rt->engine.get());
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  Clock::time_point first{}, last{};
  std::vector<int32_t> output;
  std::optional<serve::RequestOutput> end;
  const std::vector<int32_t> prompt = request.input_ids;
  Status submitted = core.submit(std::move(request), [&](const serve::RequestOutput& out) {
    if (!out.new_ids.empty()) {
      last = Clock::now();
      if (output.empty()) first = last;
      output.insert(output.end(), out.new_ids.begin(), out.new_ids.end());
    }
    if (out.finished) end = out;
  });
  if (!submitted.ok()) return fail(submitted);
  while (!core.idle()) {
    Result<sched::StepStats> st = core.step();
    if (!st.ok()) return fail(st.status());
  }
  if (!end || !serve::completed(end->finish_reason)) {
    return fail(Status::Internal(end ? end->message : "the request never ended"));
  }
  const std::string ended = serve::finish_reason_name(end->finish_reason);
  std::cout << rt->tokenizer->decode(prompt) << rt->tokenizer->decode(output) << std::endl;
  if (args.verbose) {
    auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
    std::string ids;
    for (int32_t id : output) ids += (ids.empty() ? "" : " ") + std::to_string(id);
    std::fprintf(stderr, "prompt ids:");
    for (int32_t id : prompt) std::fprintf(stderr, " %d", id);
    std::fprintf(stderr, "\ngenerated ids: %s\n", ids.c_str());
    const double prefill_s = seconds(first - start), decode_s = seconds(last - first);
    std::fprintf(stderr, "prefill: %zu tokens, %.1f tok/s; decode: %zu tokens, %.1f tok/s (%s)\n",
                 prompt.size(), static_cast<double>(prompt.size()) / prefill_s, output.size(),
                 output.size() > 1 ? static_cast<double>(output.size() - 1) / decode_s : 0.0,
                 ended.c_str());
  }
  return 0;
}

struct BenchArgs {
  std::string workload, trace, metrics_out;
  // --url: over HTTP against a running server.
  std::string url, backend = "generate", api_key, model;
  int32_t vocab_size = 0;
  double scrape_interval_s = 0.5;
  // --matrix: the product of configuration values, each run in process.
  std::vector<std::string> matrix;
  int repeat = 1;
  std::string json_out, html_out;
  std::string eval_text;  // --eval-text: accuracy columns
  int64_t eval_ctx = 0;
  bool matrix_mode() const {
    return !matrix.empty() || repeat != 1 || !json_out.empty() || !html_out.empty() ||
           !eval_text.empty();
  }
};

// The report on stdout, the metrics to --metrics-out, and exit 1 when nothing was measured.
int finish_bench(const bench::BenchReport& report, const BenchArgs& args) {
  std::cout << bench::format_report(report);
  if (!args.metrics_out.empty()) {
    std::ofstream out(args.metrics_out);
    out << report.prometheus;
    if (!out) return fail(Status::NotFound(args.metrics_out + ": cannot write the metrics"));
  }
  if (Status s = bench::nothing_measured(report); !s.ok()) return fail(s);
  return 0;
}

int run_bench_http(const bench::WorkloadSpec& workload, const BenchArgs& args) {
  Result<client::Url> url = client::parse_url(args.url);
  if (!url.ok()) return fail(url.status());
  bench::HttpBenchOptions options;
  options.url = *url;
  options.backend = args.backend;
  options.api_key = args.api_key;
  if (options.api_key.empty()) {
    if (const char* key = std::getenv("KVRT_API_KEY")) options.api_key = key;
  }
  options.model = args.model;
  options.vocab_size = args.vocab_size;
  options.scrape_interval_s = args.scrape_interval_s;
  options.progress = isatty(STDERR_FILENO) != 0;
  spdlog::info("workload {}: {} requests, concurrency {}, rate {}, against {} ({})",
               workload.source, workload.num_requests,
               workload.concurrency > 0 ? std::to_string(workload.concurrency) : "unlimited",
               workload.request_rate > 0 ? std::to_string(workload.request_rate) + "/s"
                                         : "all at once",
               args.url, args.backend);
  Result<bench::BenchReport> report = bench::drive_http(options, workload);
  if (!report.ok()) return fail(report.status());
  return finish_bench(*report, args);
}

Status write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) return Status::NotFound(path + ": cannot write");
  return Status::Ok();
}

// --matrix: every combination validated, run in turn, then the table on stdout and the files.
// Exit 1 when no combination measured anything.
int run_bench_matrix(const std::string& path, const std::vector<std::string>& overrides,
                     const bench::WorkloadSpec& workload, const BenchArgs& args) {
  bench::MatrixOptions options;
  options.config_path = path;
  options.overrides = overrides;
  options.repeat = args.repeat;
  options.progress = isatty(STDERR_FILENO) != 0;
  options.eval_text = args.eval_text;
  options.eval_ctx = args.eval_ctx;
  for (const std::string& arg : args.matrix) {
    Result<bench::MatrixAxis> axis = bench::parse_matrix_axis(arg);
    if (!axis.ok()) return fail(axis.status());
    options.axes.push_back(std::move(*axis));
  }
  if (!args.metrics_out.empty()) {
    return fail(Status::InvalidArgument(
        "--metrics-out writes one run's metrics; with --matrix, --json-out keeps every run's"));
  }
  Result<bench::MatrixResult> result = bench::run_matrix(options, workload);
  if (!result.ok()) return fail(result.status());
  std::cout << report::format_comparison(*result);
  if (!args.json_out.empty()) {
    if (Status s = write_file(args.json_out, report::to_json(*result)); !s.ok()) return fail(s);
    std::cout << "JSON: " << args.json_out << "\n";
  }
  if (!args.html_out.empty()) {
    if (Status s = write_file(args.html_out, report::to_html(*result)); !s.ok()) return fail(s);
    std::cout << "HTML report: " << args.html_out << "\n";
  }
  const bool any = std::any_of(result->runs.begin(), result->runs.end(),
                               [](const bench::MatrixRun& r) { return r.status.ok(); });
  if (!any) return fail(Status::InvalidArgument("no combination of the matrix measured anything"));
  return 0;
}

int run_bench(const std::string& path, const std::vector<std::string>& overrides,
              const BenchArgs& args) {
  if (args.workload.empty() == args.trace.empty()) {
    return fail(Status::InvalidArgument("kvrt bench: give one of --workload FILE or --trace FILE"));
  }
  Result<bench::WorkloadSpec> workload = args.trace.empty()
                                             ? bench::load_workload_toml(args.workload)
                                             : bench::load_trace_jsonl(args.trace);
  if (!workload.ok()) return fail(workload.status());
  if (!args.url.empty()) {
    if (args.matrix_mode()) {
      return fail(Status::InvalidArgument(
          "--matrix, --repeat, --json-out, --html-out and --eval-text run combinations in "
          "process; they do not go with --url"));
    }
    if (!path.empty() || !overrides.empty()) {
      return fail(Status::InvalidArgument(
          "kvrt bench --url drives a running server, configured by its own --config; --config, "
          "--set and --verify-plugins configure the in-process bench: give one or the other"));
    }
    return run_bench_http(*workload, args);
  }
  if (args.matrix_mode()) {
    if (Status s = runtime::refuse_under_launcher("kvrt bench --matrix"); !s.ok()) return fail(s);
    return run_bench_matrix(path, overrides, *workload, args);
  }
  Result<std::unique_ptr<runtime::Session>> session = runtime::start(path, overrides);
  if (!session.ok()) return fail(session.status());
  if (!(*session)->leads()) return runtime::follow(**session);
  const config::Config* cfg = &(*session)->cfg;
  runtime::Runtime* rt = &(*session)->rt;
  plugin::Registry& registry = (*session)->registry;
  spdlog::info("model {} ({} weights), TP {}, kv {}, attention {}", rt->model_name,
               rt->bf16_weights ? "bf16" : "f32", cfg->tp.size, cfg->kv.store,
               cfg->attention.backend);
  std::fprintf(stderr, "%s", rt->capacity_report.c_str());
  // Every loadable store on the same budget, for the diagnosis's "what would X give".
  const std::vector<metrics::StoreCeiling> ceilings = runtime::store_ceilings(registry, *rt);
  const bench::WorkloadSpec& w = *workload;
  spdlog::info("workload {}: {} requests, concurrency {}, rate {}, input {}, output {}{}", w.source,
               w.num_requests, w.concurrency > 0 ? std::to_string(w.concurrency) : "unlimited",
               w.request_rate > 0 ? std::to_string(w.request_rate) + "/s" : "all at once",
               w.trace.empty() ? w.input.describe() : "from the trace",
               w.trace.empty() ? w.output.describe() : "from the trace",
               w.turns > 1 ? ", " + std::to_string(w.turns) + " turns per conversation" : "");
  Result<bench::BenchReport> report = bench::run_bench(*rt, *cfg, w, ceilings);
  if (!report.ok()) return fail(report.status());
  return finish_bench(*report, args);
}

struct EvalArgs {
  std::string text, ids, stores, weights, json_out, calibrate, out, scales;
  int64_t ctx = 0;
};

// kvrt eval: calibrate first when asked (writing the scale file), then every store against the
// first, with the calibrated fp8 variant added when there are scales.
int run_eval(const std::string& path, const std::vector<std::string>& overrides,
             const EvalArgs& args) {
  if (Status s = runtime::refuse_under_launcher("kvrt eval"); !s.ok()) return fail(s);
  eval::EvalOptions options;
  options.config_path = path;
  options.overrides = overrides;
  options.corpus = {args.text, args.ids};
  options.ctx = args.ctx;
  options.progress = isatty(STDERR_FILENO) != 0;
  // --weights: the weight formats on one store (exact f32 KV unless --stores names another).
  const std::string stores = !args.stores.empty() ? args.stores
                             : !args.weights.empty()
                                 ? "kv_f32_paged"
                                 : "kv_f32_paged,kv_bf16_paged,kv_fp8_e4m3,"
                                   "kv_fp8_e4m3:scale_mode=per_tensor,kv_int4";
  for (size_t from = 0; from <= stores.size();) {
    size_t end = stores.find(',', from);
    if (end == std::string::npos) end = stores.size();
    Result<eval::StoreVariant> v = eval::parse_store_variant(stores.substr(from, end - from));
    if (!v.ok()) return fail(v.status());
    options.stores.push_back(std::move(*v));
    from = end + 1;
  }
  if (!args.weights.empty()) {
    if (options.stores.size() != 1 || !args.calibrate.empty() || !args.scales.empty()) {
      return fail(Status::InvalidArgument(
          "--weights compares weight formats on one KV store: give --stores one store (or "
          "none: kv_f32_paged), and no --calibrate or --scales"));
    }
    Result<std::vector<eval::StoreVariant>> v =
        eval::weight_variants(args.weights, options.stores[0]);
    if (!v.ok()) return fail(v.status());
    options.stores = std::move(*v);
  }
  if (!args.calibrate.empty() && args.out.empty()) {
    return fail(Status::InvalidArgument("--calibrate needs --out FILE for the scales"));
  }
  if (!args.calibrate.empty() && !args.scales.empty()) {
    return fail(Status::InvalidArgument("--calibrate writes scales and --scales reads them: give one"));
  }
  std::string scale_file = args.scales;
  if (!args.calibrate.empty()) {
    Result<eval::Calibration> c = eval::calibrate(options, args.calibrate);
    if (!c.ok()) return fail(c.status());
    if (Status s = write_file(args.out, eval::calibration_toml(*c)); !s.ok()) return fail(s);
    std::cout << "calibrated scales (" << c->tokens << " tokens): " << args.out << "\n";
    scale_file = args.out;
  }
  if (!scale_file.empty()) std::cout << "the calibrated row reads " << scale_file << "\n";
  if (!scale_file.empty()) {
    Result<eval::ScaleFile> f = eval::read_scale_file(scale_file);
    if (!f.ok()) return fail(f.status());
    options.stores.push_back({f->store + ":scale_mode=per_tensor:calibrated",
                              f->store,
                              {"kv." + f->store + ".scale_mode=per_tensor", f->calibrated_override}});
  }
  Result<eval::EvalResult> result = eval::run_eval(options);
  if (!result.ok()) return fail(result.status());
  std::cout << eval::format_eval(*result);
  if (!args.json_out.empty()) {
    if (Status s = write_file(args.json_out, eval::eval_json(*result)); !s.ok()) return fail(s);
    std::cout << "JSON: " << args.json_out << "\n";
  }
  return 0;
}

int run_command_line(int argc, char** argv);

}  // namespace
}  // namespace kvrt

// Every failure is reported as a Status; an exception that still escapes (memory exhausted by a
// request the checks let through, a library's own throw) ends the command with one line and
// exit code 1, never with std::terminate.
// Under an MPI launcher the exit goes through mpi_finish: MPI_Finalize when every rank is
// there, MPI_Abort (ending every rank) when the TP group broke.
int main(int argc, char** argv) {
  try {
    return kvrt::comm::mpi_finish(kvrt::run_command_line(argc, argv));
  } catch (const std::bad_alloc&) {
    std::cerr << "kvrt: out of memory\n";
  } catch (const std::exception& e) {
    std::cerr << "kvrt: internal error: " << e.what() << "\n";
  }
  kvrt::comm::mpi_abandon("kvrt failed with an internal error");
  return kvrt::comm::mpi_finish(1);
}

namespace kvrt {
namespace {

int run_command_line(int argc, char** argv) {
  CLI::App app{"kvrt: an LLM inference runtime whose KV cache is a plugin"};
  app.require_subcommand(1);
  // Log lines go to stderr, so stdout holds only what a command prints (a config, a table).
  spdlog::set_default_logger(spdlog::stderr_color_mt("kvrt"));
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");

  bool verbose = false;
  CLI::App* plugins = app.add_subcommand("plugins", "list loadable plugins");
  plugins->add_flag("-v,--verbose", verbose, "also print descriptions and options");

  CLI::App* config = app.add_subcommand("config", "configuration tools");
  config->require_subcommand(1);
  CLI::App* check = config->add_subcommand("check", "validate FILE and print the effective config");
  std::string config_path;
  std::vector<std::string> overrides;
  check->add_option("file", config_path, "TOML file")->required();
  check->add_option("--set", overrides, "override a key: section.key=value");

  CLI::App* capacity = app.add_subcommand("capacity", "KV capacity of every store, side by side");
  kvrt::CapacityArgs cap;
  capacity->add_option("--config", config_path, "TOML file (device, tp, scheduler, kv tables)");
  capacity->add_option("--set", overrides, "override a key: section.key=value");
  capacity->add_option("--model", cap.model,
                       "HF directory or config.json, preset, or shape (llama3-8b-shape, "
                       "kimi-k2-shape); default: the file's [model], else llama3-8b-shape");
  capacity->add_option("--layers", cap.layers, "model layers");
  capacity->add_option("--kv-heads", cap.kv_heads, "model KV heads (MHA/GQA)");
  capacity->add_option("--head-dim", cap.head_dim, "K head dim (and V's unless --v-head-dim)");
  capacity->add_option("--v-head-dim", cap.v_head_dim, "V head dim (0: V shares K's storage)");
  capacity->add_option("--kv-lora-rank", cap.kv_lora_rank, "MLA latent rank (> 0 selects MLA)");
  capacity->add_option("--qk-rope-head-dim", cap.qk_rope_head_dim, "MLA rope dims per token");
  capacity->add_option("--weights-gib", cap.weights_gib,
                       "weights, all ranks, GiB (default: from the model)");
  capacity->add_option("--tp", cap.tp, "TP ranks per replica (default: [tp] size)");
  capacity->add_option("--gpus", cap.gpus, "GPUs, a multiple of TP (default: TP)");
  capacity->add_option("--gpu-memory", cap.gpu_memory,
                       "memory per GPU, e.g. 80GiB (default: [device] memory)");

  CLI::App* generate = app.add_subcommand("generate", "generate tokens from a prompt");
  kvrt::GenerateArgs gen;
  generate->add_option("--config", config_path, "TOML file (model, device, tp, kv, attention)");
  generate->add_option("--set", overrides, "override a key: section.key=value");
  auto* prompt = generate->add_option("--prompt", gen.prompt, "text to continue");
  auto* ids = generate->add_option("--ids", gen.ids, "prompt token ids, e.g. 1,403,407");
  prompt->excludes(ids);
  generate->add_option("--max-new-tokens", gen.max_new_tokens, "tokens to generate")
      ->capture_default_str();
  generate->add_option("--temperature", gen.sampling.temperature, "0 = greedy")
      ->capture_default_str();
  generate->add_option("--top-k", gen.sampling.top_k, "0 = all")->capture_default_str();
  generate->add_option("--top-p", gen.sampling.top_p, "nucleus mass")->capture_default_str();
  generate->add_option("--min-p", gen.sampling.min_p,
                       "keep tokens at least this times as likely as the likeliest (0 = off)")
      ->capture_default_str();
  generate->add_option("--seed", gen.sampling.seed, "sampling seed")->capture_default_str();
  generate->add_option("--stop", gen.stop, "stop token ids (default: the model's EOS)");
  generate->add_flag("--ignore-eos", gen.ignore_eos, "do not stop at the model's EOS");
  generate->add_flag("--no-bos", gen.no_bos, "do not prepend BOS to --prompt");
  generate->add_flag("-v,--verbose", gen.verbose, "print ids, prefill and decode tok/s");
  bool verify_plugins = false;
  const char* verify_help =
      "run the conformance suites on the KV store and attention plugin first, refuse on failure";
  generate->add_flag("--verify-plugins", verify_plugins, verify_help);

  CLI::App* bench = app.add_subcommand(
      "bench",
      "run a workload in process through the scheduler (or with --url against a running "
      "server) and report throughput, latency, capacity use and the bottleneck");
  kvrt::BenchArgs bench_args;
  bench->add_option("--config", config_path, "TOML file (model, device, tp, kv, scheduler)");
  bench->add_option("--set", overrides, "override a key: section.key=value");
  auto* workload = bench->add_option("--workload", bench_args.workload,
                                     "workload TOML ([workload], see bench/workloads/)");
  auto* trace =
      bench->add_option("--trace", bench_args.trace,
                        "JSONL trace: {\"timestamp\", \"input_len\", \"output_len\"} per line");
  workload->excludes(trace);
  bench->add_option("--metrics-out", bench_args.metrics_out,
                    "write the Prometheus metrics (TTFT, ITL, tokens, ...) to FILE at the end");
  bench->add_flag("--verify-plugins", verify_plugins, verify_help);
  bench->add_option("--url", bench_args.url,
                    "drive a running server over HTTP instead (http://HOST:PORT: kvrt serve, "
                    "SGLang or an OpenAI-compatible one)");
  bench->add_option("--backend", bench_args.backend,
                    "with --url: generate (POST /generate), openai (POST /v1/completions) or "
                    "responses (POST /v1/responses: the prompts as text, from /detokenize)")
      ->check(CLI::IsMember({"generate", "openai", "responses"}))
      ->capture_default_str();
  bench->add_option("--api-key", bench_args.api_key,
                    "with --url: sent as Authorization: Bearer KEY (default: $KVRT_API_KEY)");
  bench->add_option("--model", bench_args.model,
                    "with --backend openai or responses: the model to name (default: "
                    "/v1/models' first)");
  bench->add_option("--vocab-size", bench_args.vocab_size,
                    "with --url: prompt ids' range when /get_model_info gives no vocab_size");
  bench->add_option("--scrape-interval", bench_args.scrape_interval_s,
                    "with --url: seconds between samples of /metrics")
      ->capture_default_str();
  bench->add_option("--matrix", bench_args.matrix,
                    "KEY=V1,V2,...: run every combination of these config values (repeatable; "
                    "e.g. kv.store=kv_bf16_paged,kv_fp8_e4m3 tp.size=1,2)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  bench->add_option("--repeat", bench_args.repeat,
                    "runs per combination, interleaved; the table gives medians and spread")
      ->capture_default_str();
  bench->add_option("--json-out", bench_args.json_out,
                    "write every figure of every run, the configurations, plugin versions and "
                    "the machine as JSON");
  bench->add_option("--html-out", bench_args.html_out,
                    "write a self-contained HTML report with charts");
  bench->add_option("--eval-text", bench_args.eval_text,
                    "with the matrix: add each combination's KL and top-1 against exact f32 KV "
                    "on this corpus (kvrt eval) to the table");
  bench->add_option("--eval-ctx", bench_args.eval_ctx,
                    "with --eval-text: tokens per window (default: the model's context)");

  CLI::App* eval_cmd = app.add_subcommand(
      "eval",
      "the accuracy cost of KV stores on the model: perplexity, KL, top-1 and greedy agreement "
      "against exact f32 KV, beside each store's capacity");
  kvrt::EvalArgs eval_args;
  eval_cmd->add_option("--config", config_path, "TOML file (model, device, tp, kv, scheduler)");
  eval_cmd->add_option("--set", overrides, "override a key: section.key=value");
  auto* eval_text = eval_cmd->add_option(
      "--text", eval_args.text, "corpus: one document per line, tokenized with the model's tokenizer");
  auto* eval_ids =
      eval_cmd->add_option("--ids", eval_args.ids, "corpus: token ids separated by spaces or commas");
  eval_text->excludes(eval_ids);
  eval_cmd->add_option("--stores", eval_args.stores,
                       "STORE[:key=value...],... to compare; the first is the reference "
                       "(default kv_f32_paged,kv_bf16_paged,kv_fp8_e4m3,"
                       "kv_fp8_e4m3:scale_mode=per_tensor,kv_int4)");
  eval_cmd->add_option("--weights", eval_args.weights,
                       "FORMAT,... weight formats (model.quantization: none, int4, fp8) to compare "
                       "on one KV store; the first is the reference (e.g. none,int4,fp8)");
  eval_cmd->add_option("--ctx", eval_args.ctx, "tokens per window (default: the model's context)");
  eval_cmd->add_option("--json-out", eval_args.json_out, "write every figure as JSON");
  eval_cmd->add_option("--calibrate", eval_args.calibrate,
                       "compute static per-layer scales for this store (kv_fp8_e4m3) first");
  eval_cmd->add_option("--out", eval_args.out, "with --calibrate: the scale file to write");
  eval_cmd->add_option("--scales", eval_args.scales,
                       "a scale file from --calibrate: adds the calibrated per-tensor fp8 row");
  eval_cmd->add_flag("--verify-plugins", verify_plugins, verify_help);

  CLI::App* serve = app.add_subcommand(
      "serve", "an HTTP server speaking SGLang's API (POST /generate, GET /metrics, ...)");
  serve->add_option("--config", config_path, "TOML file ([server] and the rest)");
  serve->add_option("--set", overrides, "override a key: section.key=value");
  serve->add_flag("--verify-plugins", verify_plugins, verify_help);

  CLI::App* tokenize = app.add_subcommand(
      "tokenize", "print the token ids of a text, a file or a conversation (no weights loaded)");
  cli::TokenizeArgs tok;
  tokenize->add_option("dir", tok.dir, "model or tokenizer directory")->required();
  tokenize->add_option("--text", tok.text, "text to tokenize");
  tokenize->add_option("--file", tok.file, "a file whose bytes are tokenized exactly");
  tokenize->add_option("--messages", tok.messages,
                       "a JSON file of [{\"role\", \"content\"}, ...]: rendered by the "
                       "directory's chat template and tokenized as apply_chat_template does");
  tokenize->add_flag("--no-generation-prompt", tok.no_generation_prompt,
                     "with --messages: add_generation_prompt false");
  tokenize->add_option("--chat-template-kwargs", tok.chat_template_kwargs,
                       "with --messages: the template's variables as a JSON object, e.g. "
                       "'{\"thinking\": false}' (SGLang's and vLLM's chat_template_kwargs)");
  tokenize->add_flag("--add-special-tokens", tok.add_special_tokens,
                     "with --text/--file: add what transformers adds (BOS)");
  tokenize->add_flag("--json", tok.json, "print {\"ids\": [...]}");

  CLI::App* detokenize =
      app.add_subcommand("detokenize", "print the text of token ids (no weights loaded)");
  cli::DetokenizeArgs detok;
  detokenize->add_option("dir", detok.dir, "model or tokenizer directory")->required();
  detokenize->add_option("--ids", detok.ids, "token ids, e.g. 1,2,3")
      ->delimiter(',')
      ->required();
  detokenize->add_flag("--skip-special-tokens", detok.skip_special_tokens,
                       "leave special tokens out (default: kept, as transformers' decode)");
  detokenize->add_flag("--json", detok.json, "print {\"text\": \"...\"}");

  CLI11_PARSE(app, argc, argv);
  if (tokenize->parsed()) return cli::run_tokenize(tok);
  if (detokenize->parsed()) return cli::run_detokenize(detok);
  if (verify_plugins) overrides.push_back("plugins.verify=true");
  if (serve->parsed()) return cli::run_serve(config_path, overrides);
  if (bench->parsed()) return kvrt::run_bench(config_path, overrides, bench_args);
  if (eval_cmd->parsed()) return kvrt::run_eval(config_path, overrides, eval_args);
  if (generate->parsed()) {
    if (gen.prompt.empty() && gen.ids.empty()) {
      std::cerr << "kvrt generate: give --prompt or --ids\n";
      return 2;
    }
    return kvrt::run_generate(config_path, overrides, gen);
  }
  if (plugins->parsed()) return kvrt::run_plugins(verbose);
  if (check->parsed()) return kvrt::run_config_check(config_path, overrides);
  if (capacity->parsed()) return kvrt::run_capacity(config_path, overrides, cap);
  return 0;
}

}  // namespace
}  // namespace kvrt
