// --json-out: every figure of every run, so a matrix can be compared with another one later.
#include <nlohmann/json.hpp>

#include "core/report/matrix_report.h"

namespace kvrt::report {
namespace {

using nlohmann::json;

json percentiles(const bench::Percentiles& p) {
  return {{"mean", p.mean}, {"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}};
}

json report_json(const bench::BenchReport& r) {
  json figures = json::object();
  for (const FigureSpec& f : report::figures()) figures[f.key] = f.get(r);
  if (r.accuracy.measured) {
    for (const FigureSpec& f : accuracy_figures()) figures[f.key] = f.get(r);
  }
  json timeline = json::array();
  for (const bench::TimelinePoint& p : r.timeline) {
    timeline.push_back({{"t_s", p.t_s},
                        {"running", p.running},
                        {"queued", p.queued},
                        {"token_usage", p.token_usage}});
  }
  const metrics::Diagnosis& d = r.diagnosis;
  json out = {
      {"figures", figures},
      {"store", r.store},
      {"max_total_num_tokens", r.max_total_num_tokens},
      {"duration_s", r.duration_s},
      {"requests", {{"sent", r.requests}, {"completed", r.completed}, {"aborted", r.aborted}}},
      {"abort_reasons", r.abort_reasons},
      {"tokens",
       {{"prompt", r.prompt_tokens},
        {"generated", r.generated_tokens},
        {"cached", r.cached_tokens},
        {"tier_loaded", r.tier_loaded_tokens}}},
      {"retractions", r.retractions},
      {"steps", r.steps},
      {"decode_steps", r.decode_steps},
      {"server_gen_throughput", r.server_gen_throughput},
      {"decode_rate_per_request", r.decode_rate_per_request},
      {"client_effective_throughput", r.client_effective_throughput},
      {"total_output_throughput", r.total_output_throughput},
      {"ttft_s", percentiles(r.ttft_s)},
      {"itl_s", percentiles(r.itl_s)},
      {"e2e_s", percentiles(r.e2e_s)},
      {"ttft_quantiles_s", r.ttft_quantiles_s},
      {"itl_quantiles_s", r.itl_quantiles_s},
      {"max_running", r.max_running},
      {"mean_running", r.mean_running},
      {"mean_token_usage", r.mean_token_usage},
      {"mean_queue", r.mean_queue},
      {"saturated",
       {{"steps", r.saturated_steps},
        {"running", r.saturated_running},
        {"live_length", r.saturated_live_length},
        {"ceiling", r.saturated_ceiling}}},
      {"diagnosis",
       {{"verdict", std::string(metrics::kind_name(d.kind))},
        {"line", d.line},
        {"mean_running", d.mean_running},
        {"mean_queue", d.mean_queue},
        {"mean_token_usage", d.mean_token_usage},
        {"kv_blocked_share", d.kv_blocked_share},
        {"mean_live_length", d.mean_live_length},
        {"ceiling", d.ceiling},
        {"mean_step_seconds", d.mean_step_seconds},
        {"mean_tokens_per_step", d.mean_tokens_per_step},
        {"admissions", d.admissions}}},
      {"timeline", timeline},
  };
  if (r.host_tier) {
    out["host_tier"] = {{"capacity_pages", r.tier.capacity_pages},
                        {"used_pages", r.tier.used_pages},
                        {"saved_pages", r.tier.saved_pages},
                        {"loaded_pages", r.tier.loaded_pages},
                        {"evicted_pages", r.tier.evicted_pages}};
  }
  return out;
}

json workload_json(const bench::WorkloadSpec& w) {
  json out = {{"source", w.source},
              {"num_requests", w.num_requests},
              {"concurrency", w.concurrency},
              {"request_rate", w.request_rate},
              {"seed", w.seed},
              {"turns", w.turns},
              {"shared_prefix_groups", w.shared_prefix_groups},
              {"shared_prefix_len", w.shared_prefix_len}};
  if (w.trace.empty()) {
    out["input"] = w.input.describe();
    out["output"] = w.output.describe();
  } else {
    out["trace_requests"] = w.trace.size();
  }
  return out;
}

}  // namespace

std::string to_json(const bench::MatrixResult& result) {
  const std::vector<CombinationSummary> summaries = summarize(result);
  json axes = json::array();
  for (const bench::MatrixAxis& a : result.axes) axes.push_back({{"key", a.key}, {"values", a.values}});
  json combinations = json::array();
  for (size_t i = 0; i < summaries.size(); ++i) {
    const CombinationSummary& s = summaries[i];
    json settings = json::object();
    for (const auto& [key, value] : s.combination->settings) settings[key] = value;
    json runs = json::array();
    json plugins = json::array();
    std::string capacity_report, model;
    for (const bench::MatrixRun* run : s.runs) {
      json r = {{"repeat", run->repeat},
                {"position", run->position},
                {"ok", run->status.ok()},
                {"error", run->status.ok() ? "" : run->status.message()},
                {"wall_s", run->wall_s}};
      if (run->status.ok() || run->report.steps > 0) r["report"] = report_json(run->report);
      runs.push_back(r);
      if (plugins.empty()) {
        for (const bench::PluginVersion& p : run->plugins) {
          plugins.push_back({{"name", p.name},
                             {"kind", p.kind},
                             {"version", p.version},
                             {"abi", p.abi},
                             {"path", p.path}});
        }
      }
      if (capacity_report.empty()) capacity_report = run->capacity_report;
      if (model.empty()) model = run->model;
    }
    json summary = json::object();
    for (const auto& [key, sp] : s.figures) {
      summary[key] = {{"median", sp.median}, {"min", sp.min}, {"max", sp.max}, {"runs", sp.n}};
    }
    combinations.push_back({{"index", i + 1},
                            {"label", s.combination->label()},
                            {"settings", settings},
                            {"config", result.configs.at(i)},
                            {"model", model},
                            {"plugins", plugins},
                            {"capacity_report", capacity_report},
                            {"ok", s.ok()},
                            {"failed_runs", s.failed},
                            {"error", s.error},
                            {"verdict", s.ok() ? std::string(metrics::kind_name(
                                                     s.median_run->report.diagnosis.kind))
                                               : "failed"},
                            {"diagnosis", s.ok() ? s.median_run->report.diagnosis.line : ""},
                            {"median_run_position", s.ok() ? json(s.median_run->position) : json()},
                            {"summary", summary},
                            {"ratio_to_first", json::object()},
                            {"runs", runs}});
  }
  // Each figure's median over the first combination's.
  if (!summaries.empty() && summaries[0].ok()) {
    for (size_t i = 0; i < summaries.size(); ++i) {
      if (!summaries[i].ok()) continue;
      for (const FigureSpec& f : figures_of(result)) {
        const double base = summaries[0].median(f.key);
        if (base > 0) combinations[i]["ratio_to_first"][f.key] = summaries[i].median(f.key) / base;
      }
    }
  }
  json units = json::object();
  for (const FigureSpec& f : figures_of(result)) units[f.key] = f.unit;
  json order = json::array();
  for (const bench::MatrixRun& run : result.runs) {
    order.push_back({{"combination", run.combination + 1}, {"repeat", run.repeat}});
  }
  const json out = {
      {"kvrt_version", result.kvrt_version},
      {"started_at", result.started_at},
      {"machine",
       {{"cpu_model", result.machine.cpu_model},
        {"cores", result.machine.cores},
        {"memory_bytes", result.machine.memory_bytes},
        {"os", result.machine.os}}},
      {"config_path", result.config_path},
      {"overrides", result.overrides},
      {"workload", workload_json(result.workload)},
      {"axes", axes},
      {"repeat", result.repeat},
      {"run_order", order},
      {"wall_s", result.wall_s},
      {"figure_units", units},
      {"combinations", combinations},
      {"eval_text", result.eval_text},
      {"eval_errors", result.eval_errors},
  };
  // Error messages quote what users gave, which need not be UTF-8.
  return out.dump(1, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace kvrt::report
