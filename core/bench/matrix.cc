#include "core/bench/matrix.h"

#include <spdlog/spdlog.h>
#include <sys/utsname.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <thread>

#include "core/eval/corpus.h"
#include "core/eval/eval.h"
#include "core/plugin/plugin_config.h"
#include "core/plugin/registry.h"
#include "core/runtime/runtime.h"
#include "core/util/file.h"
#include "core/util/progress.h"

#ifndef KVRT_VERSION
#define KVRT_VERSION "unknown"
#endif

namespace kvrt::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string_view trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// The base configuration with `settings` applied after --set.
Result<config::Config> load_with(const MatrixOptions& options,
                                 const std::vector<std::string>& settings) {
  std::vector<std::string> overrides = options.overrides;
  overrides.insert(overrides.end(), settings.begin(), settings.end());
  return config::load(options.config_path, overrides);
}

Status check_config(const MatrixOptions& options, const std::vector<std::string>& settings) {
  Result<config::Config> cfg = load_with(options, settings);
  if (!cfg.ok()) return cfg.status();
  plugin::Registry registry;
  runtime::wire_plugins(registry, *cfg);
  return runtime::check_runtime(*cfg, registry);
}

// config::load names an override "--set key=value"; here the value came from --matrix.
std::string as_matrix_setting(std::string message, const std::string& setting) {
  const std::string from = "--set " + setting;
  for (size_t at = message.find(from); at != std::string::npos; at = message.find(from, at)) {
    message.replace(at, 5, "--matrix");
    at += from.size();
  }
  return message;
}

// "[2/3 kv.store=kv_fp8_e4m3, run 1/2] [#####.....] 120/200 requests, 5.1 s (all 18.2 s)".
class ProgressBar {
 public:
  ProgressBar(bool enabled, size_t runs) : line_(enabled), runs_(runs) {}
  void start_run(size_t position, std::string label, uint64_t requests) {
    position_ = position;
    label_ = std::move(label);
    run_start_ = Clock::now();
    draw(0, requests, true);
  }
  void draw(uint64_t done, uint64_t total, bool force = false) {
    if (!line_.due(force || done >= total)) return;
    char text[512];
    std::snprintf(text, sizeof(text), "[%zu/%zu %s] %s %llu/%llu requests, %.1f s (all %.1f s)",
                  position_ + 1, runs_, label_.c_str(), util::progress_bar(done, total).c_str(),
                  static_cast<unsigned long long>(done), static_cast<unsigned long long>(total),
                  seconds_since(run_start_), seconds_since(all_start_));
    line_.draw(text);
  }
  void end_run() { line_.clear(); }

 private:
  util::ProgressLine line_;
  size_t runs_;
  size_t position_ = 0;
  std::string label_;
  Clock::time_point all_start_ = Clock::now(), run_start_;
};

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

// One run: a fresh registry and runtime for the combination, the workload through them.
MatrixRun run_one(const MatrixOptions& options, const Combination& combination,
                  const WorkloadSpec& workload, ProgressBar& bar) {
  MatrixRun run;
  const Clock::time_point start = Clock::now();
  Result<config::Config> cfg = load_with(options, combination.overrides());
  if (!cfg.ok()) {
    run.status = cfg.status();
    return run;
  }
  plugin::Registry registry;
  runtime::wire_plugins(registry, *cfg);
  Result<runtime::Runtime> rt = runtime::build_runtime(*cfg, registry);
  if (!rt.ok()) {
    run.status = rt.status();
    run.wall_s = seconds_since(start);
    return run;
  }
  run.capacity_report = rt->capacity_report;
  run.model = rt->model_name + (rt->bf16_weights ? " (bf16 weights)" : " (f32 weights)");
  for (const plugin::LoadedPlugin* p : registry.loaded()) {
    run.plugins.push_back({p->name, plugin::kind_name(p->kind()),
                           p->desc.version != nullptr ? p->desc.version : "",
                           std::to_string(p->desc.abi_major) + "." +
                               std::to_string(p->desc.abi_minor),
                           p->path.string()});
  }
  BenchOptions bench_options;
  bench_options.log = false;
  bench_options.progress = [&bar](uint64_t done, uint64_t total) { bar.draw(done, total); };
  Result<BenchReport> report =
      run_bench(*rt, *cfg, workload, runtime::store_ceilings(registry, *rt), bench_options);
  run.wall_s = seconds_since(start);
  if (!report.ok()) {
    run.status = report.status();
    return run;
  }
  run.report = std::move(*report);
  run.status = nothing_measured(run.report);
  return run;
}

// --eval-text: each combination's store against kv_f32_paged on the same configuration.
void evaluate(const MatrixOptions& options, MatrixResult& result) {
  result.eval_text = options.eval_text;
  result.eval_errors.assign(result.combinations.size(), "");
  for (const Combination& c : result.combinations) {
    Result<config::Config> cfg = load_with(options, c.overrides());
    if (!cfg.ok()) {
      result.eval_errors[c.index] = cfg.status().message();
      continue;
    }
    eval::EvalOptions eo;
    eo.config_path = options.config_path;
    eo.overrides = options.overrides;
    for (const std::string& o : c.overrides()) eo.overrides.push_back(o);
    eo.corpus.text_path = options.eval_text;
    eo.ctx = options.eval_ctx;
    eo.greedy_prompts = 0;
    eo.progress = options.progress;
    eo.stores = {{"kv_f32_paged", "kv_f32_paged", {}}, {cfg->kv.store, cfg->kv.store, {}}};
    spdlog::info("evaluating {}/{} ({}) against kv_f32_paged on {}", c.index + 1,
                 result.combinations.size(), c.label(), options.eval_text);
    Result<eval::EvalResult> r = eval::run_eval(eo);
    if (!r.ok()) {
      result.eval_errors[c.index] = r.status().message();
      spdlog::warn("evaluating {} failed: {}", c.label(), r.status().message());
      continue;
    }
    const eval::StoreResult& s = r->stores[1];
    for (MatrixRun& run : result.runs) {
      if (run.combination != c.index) continue;
      run.report.accuracy = {true, s.kl.mean, s.kl.p99, s.top1_agreement, s.perplexity_ratio};
    }
  }
}

}  // namespace

Status validate_matrix(const MatrixOptions& options,
                       const std::vector<Combination>& combinations) {
  for (const Combination& c : combinations) {
    Status s = check_config(options, c.overrides());
    if (s.ok()) continue;
    // The setting that fails alone on the base configuration, when there is one.
    for (const std::string& setting : c.overrides()) {
      Status alone = check_config(options, {setting});
      if (!alone.ok()) {
        const std::string named = "--matrix " + setting;
        const std::string message = as_matrix_setting(alone.message(), setting);
        return Status::InvalidArgument(message.rfind(named, 0) == 0 ? message
                                                                    : named + ": " + message);
      }
    }
    std::string message = s.message();
    for (const std::string& setting : c.overrides()) message = as_matrix_setting(message, setting);
    return Status::InvalidArgument("--matrix combination " + std::to_string(c.index + 1) + " of " +
                                   std::to_string(combinations.size()) + " (" + c.label() +
                                   "): " + message);
  }
  return Status::Ok();
}

MachineInfo describe_machine() {
  MachineInfo m;
  m.cores = std::thread::hardware_concurrency();
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) m.cpu_model = std::string(trim(line.substr(colon + 1)));
      break;
    }
  }
  std::ifstream meminfo("/proc/meminfo");
  std::string name;
  uint64_t kib = 0;
  if (meminfo >> name >> kib && name == "MemTotal:") m.memory_bytes = kib * 1024;
  utsname u{};
  if (uname(&u) == 0) m.os = std::string(u.sysname) + " " + u.release + " " + u.machine;
  return m;
}

Result<MatrixResult> run_matrix(const MatrixOptions& options, const WorkloadSpec& workload) {
  Result<std::vector<Combination>> combinations = expand_matrix(options.axes);
  if (!combinations.ok()) return combinations.status();
  if (options.repeat < 1 ||
      static_cast<size_t>(options.repeat) * combinations->size() > kMaxMatrixRuns) {
    return Status::InvalidArgument("--repeat " + std::to_string(options.repeat) +
                                   ": expected 1.." +
                                   std::to_string(kMaxMatrixRuns / combinations->size()) + " for " +
                                   std::to_string(combinations->size()) + " combinations");
  }
  if (Status s = validate_matrix(options, *combinations); !s.ok()) return s;
  if (!options.eval_text.empty()) {  // a corpus that cannot be read is refused before any run
    Result<std::string> corpus = util::read_file(options.eval_text, eval::kEvalCorpusFile);
    if (!corpus.ok()) return corpus.status().WithContext("--eval-text");
  }

  MatrixResult result;
  result.kvrt_version = KVRT_VERSION;
  result.started_at = utc_now();
  result.machine = describe_machine();
  result.config_path = options.config_path;
  result.overrides = options.overrides;
  result.workload = workload;
  result.axes = options.axes;
  result.combinations = *combinations;
  result.repeat = options.repeat;
  for (const Combination& c : result.combinations) {
    Result<config::Config> cfg = load_with(options, c.overrides());
    result.configs.push_back(cfg.ok() ? config::to_toml(*cfg) : "");
  }

  const std::vector<RunSlot> order = run_order(result.combinations.size(), options.repeat);
  ProgressBar bar(options.progress, order.size());
  const Clock::time_point start = Clock::now();
  for (size_t position = 0; position < order.size(); ++position) {
    const RunSlot& slot = order[position];
    const Combination& c = result.combinations[slot.combination];
    std::string label = c.label();
    if (options.repeat > 1) label += ", run " + std::to_string(slot.repeat + 1);
    bar.start_run(position, label, workload.num_requests);
    MatrixRun run = run_one(options, c, workload, bar);
    bar.end_run();
    run.combination = slot.combination;
    run.repeat = slot.repeat;
    run.position = position;
    if (run.status.ok()) {
      spdlog::info("run {}/{} ({}): {:.1f} tok/s generated, {:.1f} s", position + 1, order.size(),
                   label, run.report.server_gen_throughput, run.wall_s);
    } else {
      spdlog::warn("run {}/{} ({}) failed: {}", position + 1, order.size(), label,
                   run.status.message());
    }
    result.runs.push_back(std::move(run));
  }
  if (!options.eval_text.empty()) evaluate(options, result);
  result.wall_s = seconds_since(start);
  return result;
}

}  // namespace kvrt::bench
