// `kvrt bench --matrix KEY=V1,V2,... [--matrix ...] [--repeat N]`: one workload, same seed,
// through every combination of configuration values in one process, each combination checked
// before the first one runs, the runs interleaved so machine drift favours none of them.
// core/report turns the result into the comparison table, JSON and the HTML report.
#pragma once

#include <string>
#include <vector>

#include "core/bench/bench.h"
#include "core/bench/matrix_plan.h"
#include "core/bench/workload.h"
#include "core/util/status.h"

namespace kvrt::bench {

struct MatrixOptions {
  std::string config_path;             // "" = the defaults
  std::vector<std::string> overrides;  // --set, applied before a combination's settings
  std::vector<MatrixAxis> axes;
  int repeat = 1;         // 1..kMaxMatrixRuns / combinations
  bool progress = false;  // draw a progress bar on stderr (a terminal)
  // --eval-text FILE: after the runs, each combination's KV store through kvrt eval against
  // kv_f32_paged on this corpus, in windows of eval_ctx tokens (0: the model's context).
  std::string eval_text;
  int64_t eval_ctx = 0;
};

// Loads every combination's configuration and checks it as build_runtime would before loading
// weights (runtime::check_runtime). The first failure is an error naming the --matrix setting
// at fault when that setting alone fails on the base configuration, or else the combination.
Status validate_matrix(const MatrixOptions& options, const std::vector<Combination>& combinations);

// A plugin a run loaded, as `kvrt plugins` lists it.
struct PluginVersion {
  std::string name, kind, version, abi, path;
};

struct MachineInfo {
  std::string cpu_model;  // /proc/cpuinfo's "model name"
  unsigned cores = 0;     // hardware threads
  uint64_t memory_bytes = 0;
  std::string os;  // uname: system, release, machine
};
MachineInfo describe_machine();

// One run of one combination.
struct MatrixRun {
  size_t combination = 0;
  int repeat = 0;
  size_t position = 0;  // its place in the run order
  // Why the run measured nothing: the runtime could not be built, a step failed, or every
  // request was aborted. OK otherwise.
  Status status;
  BenchReport report;  // what was measured, also for a failed run as far as it got
  std::string capacity_report;
  std::string model;
  std::vector<PluginVersion> plugins;
  double wall_s = 0;  // building the runtime included
};

struct MatrixResult {
  std::string kvrt_version;
  std::string started_at;  // UTC, ISO 8601
  MachineInfo machine;
  std::string config_path;
  std::vector<std::string> overrides;
  WorkloadSpec workload;
  std::vector<MatrixAxis> axes;
  std::vector<Combination> combinations;
  std::vector<std::string> configs;  // each combination's effective configuration, as TOML
  int repeat = 1;
  std::vector<MatrixRun> runs;  // in run order
  double wall_s = 0;
  // With --eval-text: the corpus, and per combination why its evaluation failed ("" when it
  // ran; the figures are in each run's report.accuracy).
  std::string eval_text;
  std::vector<std::string> eval_errors;
};

// Expands, validates (nothing runs when a combination is invalid) and runs the matrix. A run
// that fails is recorded with its status and the others still run.
Result<MatrixResult> run_matrix(const MatrixOptions& options, const WorkloadSpec& workload);

}  // namespace kvrt::bench
