// The configuration: one TOML file (sections [model] [device] [tp] [kv] [attention] [scheduler]
// [server] [plugins]) plus `--set section.key=value` overrides, validated up front so that a bad
// value is reported once, as one line naming file:line:col, the dotted key, what was expected and
// what was found -- before any memory is reserved or plugin loaded.
#pragma once

#include <toml++/toml.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/config/scheduler_defaults.h"
#include "core/util/file.h"
#include "core/util/status.h"

namespace kvrt::config {

// The TOML configuration (and kvrt eval's scale files, TOML too).
inline constexpr util::FileKind kConfigFile{"configuration file", 4 * util::kMiB};

// The effective configuration. A default-constructed Config holds the defaults in its typed
// fields (the member initializers below are the single source of truth for them) and an empty
// table(); load_file / load_string / defaults() also fill table().
struct Config {
  struct Model {
    std::string preset = "synth-76m";  // built-in model shape
    std::string path;                  // weights; "" = use the preset
    std::string dtype = "auto";        // "bf16" | "f32" | "auto"
    // Products of bf16 weights: "highest" keeps the activations in f32, "medium" rounds them to
    // bf16 first (the AVX-512 BF16 dot product where the CPU has it; CPU only), "auto" is
    // "medium" for bf16 weights on a CPU with that dot product and "highest" elsewhere.
    std::string matmul_precision = "auto";
    // The projections (q, k, v, o, gate, up, down; MLA's but kv_b, and every expert's) quantized
    // at load and kept so (CPU only): "none", "int4" (groups of 32, symmetric, bf16 scale
    // amax / 7.5) or "fp8" (E4M3, one scale per output row and 128 inputs). Embeddings, norms,
    // the router and the LM head stay as loaded. A checkpoint already quantized refuses it.
    std::string quantization = "none";
  };
  struct Device {
    std::string kind = "cpu";  // "cpu" | "cuda"
    int ordinal = 0;
    // The memory budget as written ("2GiB", "1.5GB", or a count of bytes) and its value. On CPU
    // it stands in for device memory so capacity arithmetic and admission behave the same.
    std::string memory = "2GiB";
    uint64_t memory_bytes = uint64_t{2} << 30;
  };
  struct Tp {
    int size = 1;  // 1..8
    // Where the ranks run: "threads" of this process, or "mpi", one process per rank under an
    // MPI launcher (mpirun -np N). "auto" is mpi under a launcher with more than one process.
    std::string backend = "auto";
    // How long a rank waits for the others in one collective (and at start-up, ten times this)
    // before it calls the group broken and names the ranks it was waiting for. MPI only.
    double timeout_s = 60;
    // Decode context parallelism: within each group of dcp_size ranks that would hold the same
    // KV (an MLA latent on every rank; a GQA head replicated when size > KV heads), each token's
    // KV is kept by one rank only, so the pool holds dcp_size times the tokens; attention
    // partials are merged by log-sum-exp (docs/parallelism.md). Divides size.
    int dcp_size = 1;
  };
  struct Kv {
    std::string store = "kv_bf16_paged";  // plugin name; its options live in [kv.<name>]
  };
  struct Attention {
    std::string backend = "attn_cpu";  // plugin name; its options live in [attention.<name>]
  };
  // SGLang's meanings and defaults, so operators can carry their tuning over.
  struct Scheduler {
    double mem_fraction_static = 0.88;  // (0, 1): share of device memory for weights + KV
    int page_size = scheduler_defaults::kPageSize;  // tokens per KV page, power of two in 1..1024
    // tokens per prefill chunk; -1 = no chunking
    int64_t chunked_prefill_size = scheduler_defaults::kChunkedPrefillSize;
    int max_running_requests = scheduler_defaults::kMaxRunningRequests;
    // tokens admitted per prefill batch
    int64_t max_prefill_tokens = scheduler_defaults::kMaxPrefillTokens;
    int num_continuous_decode_steps = scheduler_defaults::kNumContinuousDecodeSteps;
    // (0, 1]: reservation for running requests' output
    double new_token_ratio = scheduler_defaults::kNewTokenRatio;
    double new_token_ratio_decay = scheduler_defaults::kNewTokenRatioDecay;  // (0, 1]: per step
    // (0, 1], <= new_token_ratio
    double min_new_token_ratio = scheduler_defaults::kMinNewTokenRatio;
    // cap on max_new_tokens when reserving at admission
    int64_t max_new_tokens_clip = scheduler_defaults::kMaxNewTokensClip;
    std::string schedule_policy = "fcfs";                 // "fcfs" | "lpm" (longest prefix match)
    int log_interval = scheduler_defaults::kLogInterval;  // decode steps between log lines
    // load a prefix from a host tier from this many pages
    int64_t tier_min_load_pages = scheduler_defaults::kTierMinLoadPages;
  };
  struct Server {
    std::string host = "127.0.0.1";
    int port = 30000;               // SGLang's; 0 picks a free port (the tests)
    int network_threads = 2;        // threads running the sockets (the step loop is another)
    int max_queued_requests = 1024; // waiting requests beyond this are answered 503
    int max_connections = 4096;     // past this an idle one is closed, else the new one: 503
    int64_t max_body_bytes = 16 << 20;  // larger request bodies are answered 413
    double request_timeout_s = 600;     // a request still running after this is aborted
    int stream_interval = 1;  // a stream's event per this many tokens (its first one at once)
    double header_timeout_s = 10;  // accept (or a request's first byte) to its whole header: 408
    double body_timeout_s = 30;    // the header to the whole body: 408
    double idle_timeout_s = 60;    // keep-alive: idle this long between requests, closed
    double shutdown_grace_s = 30;       // SIGTERM: running requests get this long to finish
    std::string api_key;                // "": no authentication
    std::string record_trace;           // "": none; else a JSONL file kvrt bench --trace replays
    // /generate streams the text and ids so far (false, SGLang's default) or the new ones only
    bool incremental_streaming_output = false;
    std::string metric_names = "both";  // /metrics: "kvrt" | "sglang" | "both"
    // "": the model directory's own template (refused at start-up if kvrt cannot render it);
    // "default": kvrt's "<role>: <content>" lines; else a .jinja file or a tokenizer_config.json
    std::string chat_template;
  };

  std::string source = "<defaults>";  // the file path, the source name, or "<defaults>"
  Model model;
  Device device;
  Tp tp;
  Kv kv;
  Attention attention;
  Scheduler scheduler;
  Server server;
  std::vector<std::string> plugin_paths;  // [plugins] path: extra plugin directories
  // [plugins] verify: run the conformance suites on the configured store and attention plugin
  // before serving, and refuse them on a failure (also --verify-plugins, KVRT_VERIFY_PLUGINS=1).
  bool verify_plugins = false;

  // The merged effective table: file, then overrides, then defaults for what neither set. Nodes
  // from the file or an override keep their source position, so plugin option errors found
  // later (validate_keys) still name file:line:col. It is shared between copies because
  // toml++ drops positions when it copies a node.
  const toml::table& table() const;
  // [<section>.<plugin>] (e.g. [kv.kv_fp8_e4m3]) or nullptr when the file has none.
  const toml::table* plugin_table(std::string_view section, std::string_view plugin) const;

 private:
  friend struct ConfigAccess;
  std::shared_ptr<const toml::table> table_;
};

// Loads a file; `overrides` are "section.key=value" strings as given to --set, applied after the
// file and validated like file keys. The value is read as a TOML value (0.9, 16, true, "x",
// ["a"]); text that is not TOML is taken as a bare string (kv.store=kv_fp8_e4m3).
Result<Config> load_file(const std::string& path, const std::vector<std::string>& overrides = {});
// Same, from text; `source_name` stands for the file in messages.
Result<Config> load_string(std::string_view toml_text, std::string_view source_name,
                           const std::vector<std::string>& overrides = {});
// load_file, or with no path the defaults plus `overrides` (what --config leaves out).
Result<Config> load(const std::string& path, const std::vector<std::string>& overrides = {});
// Every key at its default.
Result<Config> defaults();

// The effective configuration as TOML, in section order, every key written out; load_string
// accepts it back and gives the same values.
std::string to_toml(const Config& config);

// "512MiB", "2GiB", "1.5GB", "800M", "4096" -> bytes; nullopt when it is not a size. Units are
// case-insensitive: KiB/MiB/GiB/TiB and the bare K/M/G/T are powers of 1024 (as in llama.cpp
// and docker's -m), KB/MB/GB/TB are powers of 1000, B or no unit is bytes. Fractions round
// down to a whole byte.
std::optional<uint64_t> parse_size(std::string_view text);

// One key a table may hold; used for plugin option tables ([kv.<plugin>]).
struct KeySpec {
  enum class Type { kString, kInt, kFloat, kBool, kTable, kStringArray };
  std::string name;
  Type type;
  std::string help;
};

// Checks every key of `table` against `keys`: an unknown key is an error with a did-you-mean,
// a value of the wrong type is an error (an integer is accepted for kFloat). Reports the first
// problem in file order, as "<file>:<line>:<col>: <table_path>.<key>: ..."; `source` names the
// file when a node carries no position.
Status validate_keys(const toml::table& table, const std::vector<KeySpec>& keys,
                     std::string_view source, std::string_view table_path);

// Where `node` was written: "<file>:<line>:<col>", the "--set key=value" it came from, or
// `fallback` when it carries no position.
std::string position_of(const toml::node& node, std::string_view fallback);

// The entry of `known` closest to `unknown` (case-insensitive edit distance, a transposition
// counting one), or "" when none is within 2 edits (1 for names of up to 3 characters).
std::string suggest(std::string_view unknown, const std::vector<std::string>& known);

}  // namespace kvrt::config
