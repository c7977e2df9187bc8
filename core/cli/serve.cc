#include "core/cli/serve.h"

#include <pthread.h>
#include <unistd.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/api/chat_prompt.h"
#include "core/api/server_info.h"
#include "core/comm/mpi_group.h"
#include "core/config/config.h"
#include "core/http/server.h"
#include "core/plugin/registry.h"
#include "core/runtime/runtime.h"
#include "core/runtime/start.h"
#include "core/serve/serving_core.h"
#include "core/text/tokenizer.h"

namespace kvrt::cli {

namespace {

using nlohmann::json;

int fail(const Status& status) {
  std::cerr << "kvrt: " << status.message() << "\n";
  return 1;
}

json plugin_json(const plugin::LoadedPlugin& p) {
  return {{"name", p.name},
          {"version", p.desc.version ? p.desc.version : ""},
          {"abi", std::to_string(p.desc.abi_major) + "." + std::to_string(p.desc.abi_minor)},
          {"path", p.path.string()}};
}

// SIGINT and SIGTERM end the server; SIGUSR1 is its step thread saying the engine broke. They
// are taken by the main thread alone (sigwait): every thread started later inherits the mask.
sigset_t serve_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGUSR1);
  return signals;
}

void block_serve_signals() {
  const sigset_t signals = serve_signals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

}  // namespace

int run_serve(const std::string& config_path, const std::vector<std::string>& overrides) {
  // Before any thread starts (MPI's own included), so that every thread inherits the mask.
  block_serve_signals();
  Result<std::unique_ptr<runtime::Session>> session = runtime::start(config_path, overrides);
  if (!session.ok()) return fail(session.status());
  const sigset_t signals = serve_signals();
  if (!(*session)->leads()) {
    // A following rank serves nothing: signals end it as they end any process.
    pthread_sigmask(SIG_UNBLOCK, &signals, nullptr);
    return runtime::follow(**session);
  }
  const config::Config& cfg = (*session)->cfg;
  plugin::Registry& registry = (*session)->registry;
  runtime::Runtime& rt = (*session)->rt;
  const bool over_mpi = (*session)->mpi != nullptr && cfg.tp.size > 1;
  std::fprintf(stderr, "%s", rt.capacity_report.c_str());
  serve::ServingOptions serving =
      runtime::serving_options(cfg, rt, runtime::store_ceilings(registry, rt));
  serving.tokenizer = rt.tokenizer.get();  // the answers' text and the stop strings
  serving.eos_token_ids = rt.model.eos_token_ids;
  serve::ServingCore core(serving, rt.engine.get());
  serve::StepLoopOptions loop_options;
  loop_options.max_queued_requests = static_cast<size_t>(cfg.server.max_queued_requests);
  loop_options.max_running_requests = static_cast<size_t>(cfg.scheduler.max_running_requests);
  serve::StepLoop loop(core, loop_options);

  const http::ServerOptions options = http::server_options(cfg);
  api::ModelLimits limits;
  limits.tokenizer = rt.tokenizer.get();
  limits.vocab_size = static_cast<int32_t>(rt.model.vocab_size);
  limits.context_length = rt.model.max_position_embeddings;
  if (rt.tokenizer != nullptr) {
    limits.max_prompt_bytes = api::prompt_byte_bound(*rt.tokenizer, limits.context_length);
  }
  limits.max_sequence_tokens =
      std::min<int64_t>(limits.context_length, static_cast<int64_t>(core.max_total_num_tokens()));
  // What a request leaves unset: the model's generation_config.json, else SGLang's and OpenAI's.
  limits.defaults = api::request_defaults(rt.generation);
  spdlog::info(
      "sampling defaults: {} (from {})",
      api::defaults_json(limits.defaults).dump(-1, ' ', false, json::error_handler_t::replace),
      limits.defaults.source);
  // The chat template: the model directory's own unless [server] chat_template names another;
  // one kvrt cannot render stops the server here, never a silent fallback.
  Result<api::ChatFormat> chat =
      api::resolve_chat_format(cfg.server.chat_template, cfg.model.path, rt.tokenizer.get());
  if (!chat.ok()) return fail(chat.status());
  limits.chat = &*chat;
  spdlog::info("chat template: {}", chat->description);
  const std::string chat_template = chat->description;
  const std::string effective = config::to_toml(cfg);
  const json store = plugin_json(*registry.load(cfg.kv.store).value());
  const json attention = plugin_json(*registry.load(cfg.attention.backend).value());
  api::ServerInfo info;
  info.model_name = rt.model_name;
  const std::string tokenizer_path =
      cfg.model.path.empty() ? "" : text::model_tokenizer_path(cfg.model.path);
  info.model_info = json{{"model_path", rt.model_name},
                         {"tokenizer_path", tokenizer_path},
                         {"is_generation", true},
                         {"vocab_size", rt.model.vocab_size},
                         {"context_length", rt.model.max_position_embeddings},
                         {"architecture", rt.model.architecture},
                         {"architectures", json::array({rt.model.architecture})},
                         {"model_type", model::model_type_of(rt.model)}}
                        .dump(-1, ' ', false, json::error_handler_t::replace);
  const std::string served_model_name = rt.model_name;
  const api::RequestDefaults defaults = limits.defaults;
  loop.describe([&cfg, &rt, effective, store, attention, chat_template, served_model_name,
                 defaults](const serve::ServingCore& c) {
    const metrics::Diagnosis d = c.diagnosis();
    // SGLang's keys first (what its tools and operators read), then kvrt's own.
    json described = api::sglang_server_info(cfg, c, store["name"].get<std::string>(),
                                                served_model_name, defaults);
    // The longest prompt a request may have (as SGLang's): within the context and the pool,
    // less the one token it must be able to generate.
    const int64_t max_req_input_len =
        std::min<int64_t>(rt.model.max_position_embeddings,
                          static_cast<int64_t>(c.max_total_num_tokens())) -
        1;
    described.update(json{{"config", effective},
                          {"model_path", rt.model_name},
                          {"version", KVRT_VERSION},
                          {"max_req_input_len", max_req_input_len},
                          {"kv_store", store},
                          {"attention_backend", attention},
                          {"chat_template", chat_template},
                          {"capacity_report", rt.capacity_report},
                          {"diagnosis", d.line},
                          {"num_running_reqs", c.scheduler().num_running()}});
    return described.dump(-1, ' ', false, json::error_handler_t::replace);
  });
  http::HttpServer http(options, loop, limits, std::move(info));
  // A broken engine (its TP group failed) ends the server: the main thread hears it as SIGUSR1.
  loop.on_engine_broken([](const std::string&) { kill(getpid(), SIGUSR1); });
  loop.start();
  if (Status s = http.start(); !s.ok()) return fail(s);
  spdlog::info("kvrt serve: listening on http://{}:{} (model {}, kv {}, attention {}, TP {})",
               cfg.server.host, http.port(), rt.model_name, cfg.kv.store, cfg.attention.backend,
               cfg.tp.size);
  // The line scripts and tests wait for, on stdout.
  std::cout << "listening on " << cfg.server.host << ":" << http.port() << std::endl;

  int sig = 0;
  while (sigwait(&signals, &sig) != 0) {
  }
  double grace = cfg.server.shutdown_grace_s;
  if (sig == SIGUSR1) {
    grace = 0;  // nothing can finish
    spdlog::error("kvrt serve: {}; every request got a 500, shutting down",
                  rt.engine->broken_reason().message());
  } else if (over_mpi) {
    // Under an MPI launcher a SIGTERM is the job ending (mpirun forwards it to every rank, or a
    // rank exited and it is stopping the others, with SIGKILL a second later): the other ranks
    // are gone or going, so no request can finish. Their waits end now, and each gets a 500.
    grace = 0;
    comm::mpi_abandon("kvrt serve: signal " + std::to_string(sig) +
                      ": the MPI job is ending (under mpirun: another rank exited, or the job was "
                      "stopped)");
    spdlog::warn("kvrt serve: signal {} under mpirun: {} requests end now", sig,
                 loop.unfinished());
  } else {
    spdlog::info("kvrt serve: signal {}: no new connections; {} requests get {} s to finish", sig,
                 loop.unfinished(), grace);
  }
  http.stop_accepting();
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(grace));
  while (loop.unfinished() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  loop.stop("the server shut down before the request finished (shutdown_grace_s)");
  // The aborted requests' answers go out before the connections close.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  http.shutdown();
  spdlog::info("kvrt serve: stopped");
  if (sig == SIGUSR1) return fail(rt.engine->broken_reason());
  return 0;
}

}  // namespace kvrt::cli
