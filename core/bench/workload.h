// Workloads for `kvrt bench`: who sends what, when. A TOML file describes length distributions,
// the arrival process (a concurrency limit and/or a Poisson request rate), shared-prefix groups
// and multi-turn conversations; a JSONL trace lists requests one per line instead. Token ids
// are drawn from a seeded generator, so a workload is the same in every run and for every store.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/sampling/sampler.h"
#include "core/util/status.h"

namespace kvrt::bench {

// A distribution of token counts.
struct LengthDist {
  enum class Kind { kFixed, kUniform, kLognormal };
  Kind kind = Kind::kFixed;
  int64_t value = 128;  // fixed
  int64_t min = 1;      // uniform: [min, max]; lognormal: at least min
  int64_t max = 128;    // uniform: [min, max]; lognormal: capped at max
  double mean = 128;    // lognormal: the mean before capping
  double sigma = 0.8;   // lognormal: the spread of log(length)
  int64_t sample(std::mt19937_64& rng) const;
  double expected() const;  // the mean after capping (by quadrature for lognormal)
  int64_t largest() const { return kind == Kind::kFixed ? value : max; }
  std::string describe() const;
};

// The longest schedule a bench plans (arrival times past it are refused), the longest prompt or
// output it asks for, and the most prompt tokens it generates for a workload (1 GiB of ids).
inline constexpr double kMaxBenchSeconds = 24 * 3600;
inline constexpr int64_t kMaxLength = 1 << 20;
inline constexpr uint64_t kMaxPlannedTokens = uint64_t{1} << 28;

// One request of a JSONL trace.
struct TraceEntry {
  double arrival_s = 0;    // seconds after the start ("timestamp" in the file)
  int64_t input_len = 0;   // "input_len"
  int64_t output_len = 0;  // "output_len"
  int group = -1;          // "group": requests of one group share a prefix of prefix_len tokens
  int64_t prefix_len = 0;  // "prefix_len"
  // How it sampled ("temperature", "top_p", "top_k", "min_p", "seed", "frequency_penalty",
  // "presence_penalty", "repetition_penalty", each optional, kvrt serve's record_trace writing
  // them); nullopt when the line has none of them: greedy, as traces recorded before them.
  std::optional<sampling::SamplingParams> sampling;
};

struct WorkloadSpec {
  std::string source = "<defaults>";
  uint64_t num_requests = 64;  // with turns > 1: conversations * turns
  int concurrency = 0;         // requests in flight at most; 0 = no limit
  double request_rate = 0;     // requests per second, Poisson arrivals; 0 = all at once
  uint64_t seed = 1;
  LengthDist input, output;
  // Shared-prefix groups: each request starts with one of `groups` fixed prompts of
  // `prefix_len` tokens (a system prompt), then its own input.
  int shared_prefix_groups = 0;
  int64_t shared_prefix_len = 0;
  // Multi-turn conversations: each turn after the first is sent when the previous one ends,
  // its prompt being the conversation so far (prompts and answers) plus `input` new tokens.
  int turns = 1;
  std::vector<TraceEntry> trace;  // when set, the requests (arrival times, lengths, groups)
  // [workload.sampling] (temperature, top_p, top_k, min_p): how every generated request samples,
  // each with its own seed from the workload's seed and the request's id, so a run (and every
  // combination of a --matrix) draws the same; nullopt: greedy. A trace's lines say their own.
  std::optional<sampling::SamplingParams> sampling;
};

// [workload] with [workload.input] / [workload.output] tables. Every key is checked: an unknown
// key or a value out of range is an error naming file:line:col and the key.
Result<WorkloadSpec> load_workload_toml(const std::string& path);
Result<WorkloadSpec> parse_workload_toml(const std::string& text, const std::string& source);
// One JSON object per line: {"timestamp": 0.5, "input_len": 100, "output_len": 300,
// "group": 2, "prefix_len": 64, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0,
// "seed": 42} (all but the lengths optional; the sampling keys as TraceEntry::sampling says).
// Errors name file:line and the key.
Result<WorkloadSpec> load_trace_jsonl(const std::string& path);
Result<WorkloadSpec> parse_trace_jsonl(const std::string& text, const std::string& source);

// A request the client will send: its prompt ids, how many tokens it asks for, when (seconds
// after the start; conversations' later turns have no time of their own), and its place in a
// conversation.
struct PlannedRequest {
  uint64_t id = 0;
  double arrival_s = 0;
  std::vector<int32_t> prompt;  // for a later turn: only the new input
  int32_t max_new_tokens = 0;
  // A trace's request's own sampling; nullopt: greedy (the drivers send temperature 0).
  std::optional<sampling::SamplingParams> sampling;
  int64_t conversation = -1;  // -1: a single request
  int turn = 0;
};

// The first requests of every conversation (or every request), in arrival order, and the
// generator for later turns' new input. Token ids lie in [first_id, vocab_size).
class WorkloadPlan {
 public:
  WorkloadPlan(const WorkloadSpec& spec, int32_t vocab_size);
  const std::vector<PlannedRequest>& initial() const { return initial_; }
  // The next turn of `conversation` after turn `turn`, or false when it has no more turns.
  bool next_turn(int64_t conversation, int turn, PlannedRequest* out);
  uint64_t total_requests() const { return total_; }

 private:
  std::vector<int32_t> random_tokens(int64_t n);
  // A generated request's sampling: [workload.sampling] with a seed of its own, or greedy.
  std::optional<sampling::SamplingParams> sampling_of(uint64_t id) const;
  const WorkloadSpec spec_;
  int32_t vocab_size_;
  std::mt19937_64 rng_;
  std::vector<PlannedRequest> initial_;
  uint64_t total_ = 0;
  uint64_t next_id_ = 0;
};

}  // namespace kvrt::bench
