// The serving core's one stepping thread, fed by other threads (the HTTP server's network
// threads). Requests are checked on the caller's thread (ServingCore::check_request reads only
// the options) and queued with aborts and commands in a locked inbox; outputs leave through
// each request's sink, called on the step thread (a sink posts them to its connection). The
// loop never waits on a socket: it sleeps only when the core is idle and the inbox empty.
//
// Readers never wait on the step thread either: after each step that ended a request, every
// kSnapshotInterval while busy and whenever it goes idle, the loop publishes a LoopSnapshot
// (the Prometheus text, the server's self-description, the queue) that /metrics,
// /get_server_info and /health read as it is. A request's end is in the snapshot before its
// sink hears it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/serve/request.h"
#include "core/serve/serving_core.h"

namespace kvrt::serve {

struct LoopSnapshot {
  std::string prometheus;   // GET /metrics
  std::string description;  // StepLoop::describe's text (GET /get_server_info)
  size_t running = 0, waiting = 0;
  uint64_t tokens_in_use = 0;  // KV tokens held by requests
  bool engine_broken = false;
};

struct StepLoopOptions {
  // The bounded waiting queue: submitted and unfinished requests beyond max_queued_requests +
  // max_running_requests are refused.
  size_t max_queued_requests = 0;
  size_t max_running_requests = 0;
  // The longest a snapshot goes unrefreshed while the loop is busy.
  std::chrono::milliseconds snapshot_interval{100};
};

class StepLoop {
 public:
  StepLoop(ServingCore& core, const StepLoopOptions& options);
  ~StepLoop();  // stop()
  StepLoop(const StepLoop&) = delete;
  StepLoop& operator=(const StepLoop&) = delete;

  // What the snapshot's description holds (GET /get_server_info's JSON); set before start().
  void describe(std::function<std::string(const ServingCore&)> fn) { describe_ = std::move(fn); }
  // Called once, on the step thread, when the engine breaks for good (its TP group failed):
  // every unfinished request has then ended as an engine failure. Set before start().
  void on_engine_broken(std::function<void(const std::string& why)> fn) {
    on_engine_broken_ = std::move(fn);
  }
  void start();
  // Aborts every unfinished request with `reason` (each sink hears it), then joins the thread.
  void stop(const std::string& reason = "the server is shutting down");

  // A fresh request id (unique for this loop's lifetime).
  uint64_t next_id() { return next_id_.fetch_add(1); }
  // From any thread: every request of a batch is queued, or none is. The refusals:
  //   InvalidArgument  a request can never be served: ServingCore::check_request's refusal
  //                    (naming the field), or a batch larger than the queue can ever hold
  //                    (field "batch"); a 400.
  //   NoMemory         the queue is full now: retry later (a 503).
  //   Internal         the loop is stopping (a 503).
  // The sinks of a refused batch are never called; `refused`, when given, is set to the index
  // of the request check_request refused.
  Status submit(std::vector<std::pair<GenerateRequest, RequestSink>> batch,
                size_t* refused = nullptr);
  Status submit(GenerateRequest request, RequestSink sink);
  // From any thread: aborts the request if it is still unfinished.
  void abort(uint64_t id, const std::string& reason);
  // The latest snapshot; never waits on the step thread.
  std::shared_ptr<const LoopSnapshot> snapshot() const;
  // Runs `fn` on the step thread between steps and returns its result, for a command that
  // changes the core (POST /flush_cache). After stop() it runs on the caller's thread.
  template <class F>
  auto call(F fn) -> decltype(fn(std::declval<ServingCore&>())) {
    using R = decltype(fn(core_));
    auto task = std::make_shared<std::packaged_task<R()>>([this, fn] { return fn(core_); });
    std::future<R> result = task->get_future();
    if (!post([task] { (*task)(); }, /*new_work=*/false)) (*task)();
    return result.get();
  }
  size_t unfinished() const { return unfinished_.load(); }
  size_t capacity() const { return max_unfinished_; }

 private:
  // Queues a command for the step thread; false once stopped (or, for new work, stopping).
  bool post(std::function<void()> command, bool new_work);
  void run();
  void publish();
  // The outputs held back during commands and steps, after a snapshot when one ended.
  void flush_outbox();

  ServingCore& core_;
  const StepLoopOptions options_;
  const size_t max_unfinished_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<size_t> unfinished_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> inbox_;
  bool stopping_ = false;
  bool stopped_ = false;
  std::thread thread_;
  mutable std::mutex snapshot_mutex_;
  std::shared_ptr<const LoopSnapshot> snapshot_;
  std::function<std::string(const ServingCore&)> describe_;
  std::function<void(const std::string&)> on_engine_broken_;
  // Step thread only.
  std::vector<std::pair<std::shared_ptr<const RequestSink>, RequestOutput>> outbox_;
  bool outbox_has_end_ = false;
  bool engine_broken_ = false;
  std::chrono::steady_clock::time_point published_{};
};

}  // namespace kvrt::serve
