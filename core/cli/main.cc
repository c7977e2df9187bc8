// kvrt: the command line.
//   kvrt plugins [-v]                         what can be loaded, and why not
//   kvrt config check FILE [--set k=v ...]    validate and print the effective configuration
//   kvrt capacity [--config FILE] [...]       KV capacity of every store for a geometry
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>

#include "core/capacity/capacity.h"
#include "core/config/config.h"
#include "core/exec/generate.h"
#include "core/exec/runtime.h"
#include "core/plugin/plugin_config.h"
#include "core/plugin/registry.h"

namespace kvrt {
namespace {

int fail(const Status& status) {
  std::cerr << "kvrt: " << status.message() << "\n";
  return 1;
}

Result<config::Config> load_config(const std::string& path,
                                   const std::vector<std::string>& overrides) {
  return path.empty() ? config::load_string("", "<defaults>", overrides)
                      : config::load_file(path, overrides);
}

void wire(plugin::Registry& registry, const config::Config& cfg) {
  registry.add_search_dirs(cfg.plugin_paths);
  registry.set_config_source(
      [&cfg](const std::string& name) { return cfg.plugin_table("kv", name); });
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
  Result<config::Config> cfg = load_config(path, overrides);
  if (!cfg.ok()) return fail(cfg.status());
  plugin::Registry registry;
  wire(registry, *cfg);
  Status s = plugin::check_plugin_tables(registry, *cfg);
  if (!s.ok()) return fail(s);
  std::string text = config::to_toml(*cfg);
  std::cout << text << (text.empty() || text.back() != '\n' ? "\n" : "");
  return 0;
}

struct Shape {
  uint32_t layers = 32, kv_heads = 8, head_dim = 128, v_head_dim = 128;
  double weights_gib = 14.96;  // Llama-3-8B in bf16: 8.03e9 parameters * 2 bytes
};

int run_capacity(const std::string& path, const std::vector<std::string>& overrides,
                 const Shape& shape) {
  Result<config::Config> cfg = load_config(path, overrides);
  if (!cfg.ok()) return fail(cfg.status());
  plugin::Registry registry;
  wire(registry, *cfg);
  registry.discover();

  const uint32_t tp = static_cast<uint32_t>(cfg->tp.size);
  kvrt_kv_geometry g{};
  g.struct_size = sizeof(g);
  g.num_layers = shape.layers;
  g.total_kv_heads = shape.kv_heads;
  Result<uint32_t> heads = capacity::kv_heads_per_rank(shape.kv_heads, tp);
  if (!heads.ok()) return fail(heads.status());
  g.num_kv_heads = *heads;
  g.k_head_dim = shape.head_dim;
  g.v_head_dim = shape.v_head_dim;
  g.page_size = static_cast<uint32_t>(cfg->scheduler.page_size);
  g.input_dtype = KVRT_DTYPE_BF16;
  g.tp_size = tp;
  g.device = {sizeof(kvrt_device), KVRT_DEVICE_CPU, 0, 0};

  capacity::Budget budget;
  budget.device_memory = cfg->device.memory_bytes;
  budget.weights_per_rank = static_cast<uint64_t>(shape.weights_gib * (1ull << 30) / tp);
  budget.mem_fraction_static = cfg->scheduler.mem_fraction_static;
  std::printf("geometry: %u layers, %u KV heads (%u per rank at TP %u), head dim %u/%u, page %u\n",
              g.num_layers, g.total_kv_heads, g.num_kv_heads, tp, g.k_head_dim, g.v_head_dim,
              g.page_size);
  std::printf("device memory %s, weights per rank %s, mem_fraction_static %.2f\n\n",
              capacity::format_bytes(budget.device_memory).c_str(),
              capacity::format_bytes(budget.weights_per_rank).c_str(), budget.mem_fraction_static);
  std::printf("%-16s %10s %12s %12s %22s %8s %8s %8s %14s\n", "STORE", "BYTES/TOK", "PAGE",
              "KV BUDGET", "MAX_TOTAL_NUM_TOKENS", "@1K", "@4K", "@16K", "HOST TIER TOK");
  for (const plugin::LoadedPlugin* p : registry.loaded()) {
    if (p->kind() != KVRT_PLUGIN_KV_STORE) continue;
    const kvrt_config* own = plugin::as_config(registry.plugin_config(p->name));
    uint64_t page_bytes = 0;
    plugin::clear_last_error();
    kvrt_status st = p->kv.page_bytes(p->host_api(), &g, own, &page_bytes);
    if (st != KVRT_OK) {
      std::printf("%-16s %s\n", p->name.c_str(),
                  plugin::plugin_failure(p->name, "page_bytes", st).message().c_str());
      continue;
    }
    Result<capacity::Plan> plan = capacity::plan(budget, page_bytes, g.page_size);
    if (!plan.ok()) {
      std::printf("%-16s %s\n", p->name.c_str(), plan.status().message().c_str());
      continue;
    }
    // A host tier's size is its own (ratio of the device pool or GiB); it adds no decode room.
    std::string host_tokens = "-";
    if (p->kv.tier_info != nullptr) {
      const toml::table* t = registry.plugin_config(p->name);
      double gib = t ? t->at_path("host_pool_gib").value_or(0.0) : 0.0;
      double ratio = t ? t->at_path("host_pool_ratio").value_or(2.0) : 2.0;
      uint64_t pages = gib > 0 ? static_cast<uint64_t>(gib * (1ull << 30)) / page_bytes
                               : static_cast<uint64_t>(ratio * plan->num_pages);
      host_tokens = std::to_string(pages * g.page_size);
    }
    std::printf(
        "%-16s %10llu %12s %12s %22llu %8llu %8llu %8llu %14s\n", p->name.c_str(),
        static_cast<unsigned long long>(plan->bytes_per_token()),
        capacity::format_bytes(page_bytes).c_str(), capacity::format_bytes(plan->kv_budget).c_str(),
        static_cast<unsigned long long>(plan->max_total_num_tokens),
        static_cast<unsigned long long>(plan->concurrent_decodes(1024)),
        static_cast<unsigned long long>(plan->concurrent_decodes(4096)),
        static_cast<unsigned long long>(plan->concurrent_decodes(16384)), host_tokens.c_str());
  }
  std::printf(
      "\n@N: requests that can decode at once when each holds N tokens of KV.\n"
      "A host tier keeps evicted prefixes for reuse; it does not raise @N.\n");
  return 0;
}

struct GenerateArgs {
  std::string prompt;
  std::string ids;  // "1,403,407"
  std::string stop;
  bool no_bos = false;
  bool ignore_eos = false;
  bool verbose = false;
  exec::GenerateOptions options;
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
                 GenerateArgs args) {
  Result<config::Config> cfg = load_config(path, overrides);
  if (!cfg.ok()) return fail(cfg.status());
  plugin::Registry registry;
  wire(registry, *cfg);
  registry.set_config_source([&cfg](const std::string& name) -> const toml::table* {
    const toml::table* t = cfg->plugin_table("kv", name);
    return t != nullptr ? t : cfg->plugin_table("attention", name);
  });
  Result<exec::Runtime> rt = exec::build_runtime(*cfg, registry);
  if (!rt.ok()) return fail(rt.status());
  std::vector<int32_t> prompt;
  if (!args.ids.empty()) {
    Result<std::vector<int32_t>> ids = parse_ids(args.ids, "--ids");
    if (!ids.ok()) return fail(ids.status());
    prompt = *ids;
  } else {
    prompt = rt->tokenizer->encode(args.prompt, !args.no_bos);
  }
  if (!args.stop.empty()) {
    Result<std::vector<int32_t>> stop = parse_ids(args.stop, "--stop");
    if (!stop.ok()) return fail(stop.status());
    args.options.stop_ids = *stop;
  } else if (!args.ignore_eos) {
    args.options.stop_ids = rt->model.eos_token_ids;
  }
  args.options.prefill_chunk = cfg->scheduler.chunked_prefill_size;
  if (args.verbose) {
    std::fprintf(stderr,
                 "model %s (%s weights), TP %d, kv %s, attention %s; KV pool %llu pages of %u "
                 "tokens (%llu tokens, %llu bytes/token)\n",
                 rt->model_name.c_str(), rt->bf16_weights ? "bf16" : "f32", cfg->tp.size,
                 cfg->kv.store.c_str(), cfg->attention.backend.c_str(),
                 static_cast<unsigned long long>(rt->plan.num_pages), rt->plan.page_size,
                 static_cast<unsigned long long>(rt->plan.max_total_num_tokens),
                 static_cast<unsigned long long>(rt->plan.bytes_per_token()));
  }
  Result<exec::GenerateResult> out = exec::generate(*rt->engine, prompt, args.options);
  if (!out.ok()) return fail(out.status());
  std::cout << rt->tokenizer->decode(prompt) << rt->tokenizer->decode(out->ids) << std::endl;
  if (args.verbose) {
    std::string ids;
    for (int32_t id : out->ids) ids += (ids.empty() ? "" : " ") + std::to_string(id);
    std::fprintf(stderr, "prompt ids:");
    for (int32_t id : prompt) std::fprintf(stderr, " %d", id);
    std::fprintf(stderr, "\ngenerated ids: %s\n", ids.c_str());
    std::fprintf(
        stderr, "prefill: %zu tokens, %.1f tok/s; decode: %zu tokens, %.1f tok/s (%s)\n",
        prompt.size(), static_cast<double>(prompt.size()) / out->prefill_seconds, out->ids.size(),
        out->ids.size() > 1 ? static_cast<double>(out->ids.size() - 1) / out->decode_seconds : 0.0,
        out->stop_reason.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace kvrt

int main(int argc, char** argv) {
  CLI::App app{"kvrt: an LLM inference runtime whose KV cache is a plugin"};
  app.require_subcommand(1);
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
  kvrt::Shape shape;
  capacity->add_option("--config", config_path, "TOML file (device, tp, scheduler, kv tables)");
  capacity->add_option("--set", overrides, "override a key: section.key=value");
  capacity->add_option("--layers", shape.layers, "model layers")->capture_default_str();
  capacity->add_option("--kv-heads", shape.kv_heads, "model KV heads")->capture_default_str();
  capacity->add_option("--head-dim", shape.head_dim, "K head dim")->capture_default_str();
  capacity->add_option("--v-head-dim", shape.v_head_dim, "V head dim (0: shares K, MLA)")
      ->capture_default_str();
  capacity->add_option("--weights-gib", shape.weights_gib, "weights, all ranks, GiB")
      ->capture_default_str();

  CLI::App* generate = app.add_subcommand("generate", "generate tokens from a prompt");
  kvrt::GenerateArgs gen;
  generate->add_option("--config", config_path, "TOML file (model, device, tp, kv, attention)");
  generate->add_option("--set", overrides, "override a key: section.key=value");
  auto* prompt = generate->add_option("--prompt", gen.prompt, "text to continue");
  auto* ids = generate->add_option("--ids", gen.ids, "prompt token ids, e.g. 1,403,407");
  prompt->excludes(ids);
  generate->add_option("--max-new-tokens", gen.options.max_new_tokens, "tokens to generate")
      ->capture_default_str();
  generate->add_option("--temperature", gen.options.sampling.temperature, "0 = greedy")
      ->capture_default_str();
  generate->add_option("--top-k", gen.options.sampling.top_k, "0 = all")->capture_default_str();
  generate->add_option("--top-p", gen.options.sampling.top_p, "nucleus mass")
      ->capture_default_str();
  generate->add_option("--seed", gen.options.sampling.seed, "sampling seed")->capture_default_str();
  generate->add_option("--stop", gen.stop, "stop token ids (default: the model's EOS)");
  generate->add_flag("--ignore-eos", gen.ignore_eos, "do not stop at the model's EOS");
  generate->add_flag("--no-bos", gen.no_bos, "do not prepend BOS to --prompt");
  generate->add_flag("-v,--verbose", gen.verbose, "print ids, prefill and decode tok/s");

  CLI11_PARSE(app, argc, argv);
  if (generate->parsed()) {
    if (gen.prompt.empty() && gen.ids.empty()) {
      std::cerr << "kvrt generate: give --prompt or --ids\n";
      return 2;
    }
    return kvrt::run_generate(config_path, overrides, gen);
  }
  if (plugins->parsed()) return kvrt::run_plugins(verbose);
  if (check->parsed()) return kvrt::run_config_check(config_path, overrides);
  if (capacity->parsed()) return kvrt::run_capacity(config_path, overrides, shape);
  return 0;
}
