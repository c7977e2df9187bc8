// The serving core's one stepping thread, fed by the network threads. Requests, aborts and
// queries reach it through a locked inbox; tokens and finishes leave it through each request's
// sink, called on the step thread (a sink posts them to its connection). The loop never waits
// on a socket: it sleeps only when the core is idle and the inbox empty.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "core/serve/serving_core.h"

namespace kvrt::server {

// Whose fault a request's abort was, when it was one.
enum class Fault {
  kNone,
  // The core refused the request as it was submitted (too long for the context or the pool,
  // a bad sampling value): the client's request was at fault (a 400).
  kRequest,
  // The engine failed the step that ran it (a 500); the server goes on with the others.
  kEngine,
};

// What a request's owner hears, on the step thread: each token, then the end exactly once.
struct RequestSink {
  std::function<void(const sched::Request&, int32_t token)> on_token;
  std::function<void(const sched::Request&, sched::FinishKind, const std::string& reason,
                     Fault fault)>
      on_finish;
};

class StepLoop {
 public:
  // `max_unfinished`: requests submitted and not yet finished beyond which submit() refuses
  // (the bounded waiting queue: running plus waiting).
  StepLoop(serve::ServingCore& core, size_t max_unfinished);
  ~StepLoop();  // stop()
  StepLoop(const StepLoop&) = delete;
  StepLoop& operator=(const StepLoop&) = delete;

  void start();
  // Aborts every unfinished request with `reason` (each sink hears it), then joins the thread.
  void stop(const std::string& reason = "the server is shutting down");

  // A fresh request id (unique for this loop's lifetime).
  uint64_t next_id() { return next_id_.fetch_add(1); }
  // From any thread: queues the request (its id set by the caller); false when the queue is
  // full, and then the sink is never called.
  bool submit(serve::GenerateRequest request, RequestSink sink);
  // From any thread: aborts the request if it is still unfinished.
  void abort(uint64_t id, const std::string& reason);
  // Runs `fn` on the step thread between steps and returns its result (for /metrics and the
  // like, which read the core). After stop() it runs on the caller's thread.
  template <class F>
  auto call(F fn) -> decltype(fn(std::declval<serve::ServingCore&>())) {
    using R = decltype(fn(core_));
    auto task = std::make_shared<std::packaged_task<R()>>([this, fn] { return fn(core_); });
    std::future<R> result = task->get_future();
    if (!post([task] { (*task)(); }, /*new_work=*/false)) (*task)();
    return result.get();
  }
  size_t unfinished() const { return unfinished_.load(); }
  // Called once, on the step thread, when the engine breaks for good (its TP group failed):
  // every unfinished request has then ended as an engine failure. Set before start().
  void on_engine_broken(std::function<void(const std::string& why)> fn) {
    on_engine_broken_ = std::move(fn);
  }

 private:
  // Queues a command for the step thread; false once stopped (or, for new work, stopping).
  bool post(std::function<void()> command, bool new_work);
  void run();
  void abort_all(const std::string& reason);

  serve::ServingCore& core_;
  const size_t max_unfinished_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<size_t> unfinished_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> inbox_;
  bool stopping_ = false;
  bool stopped_ = false;
  std::thread thread_;
  // Step thread only.
  std::unordered_map<uint64_t, RequestSink> sinks_;
  uint64_t submitting_ = 0;  // the request inside core_.submit(), 0 when none
  bool engine_broken_ = false;  // every abort from now on is the engine's fault
  std::function<void(const std::string&)> on_engine_broken_;
  uint64_t failing_ = 0;     // the request being aborted for an engine failure, 0 when none
};

}  // namespace kvrt::server
