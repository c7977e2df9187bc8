#include "core/server/step_loop.h"

#include <pthread.h>
#include <spdlog/spdlog.h>

#include <vector>

namespace kvrt::server {

StepLoop::StepLoop(serve::ServingCore& core, size_t max_unfinished)
    : core_(core), max_unfinished_(max_unfinished) {
  core_.on_token([this](const sched::Request& r, int32_t token) {
    auto it = sinks_.find(r.spec.id);
    if (it != sinks_.end() && it->second.on_token) it->second.on_token(r, token);
  });
  core_.on_finish([this](const sched::Request& r, sched::FinishKind kind, const std::string& why) {
    auto it = sinks_.find(r.spec.id);
    if (it == sinks_.end()) return;
    RequestSink sink = std::move(it->second);
    sinks_.erase(it);
    unfinished_.fetch_sub(1);
    const Fault fault = r.spec.id == submitting_ ? Fault::kRequest
                        : r.spec.id == failing_ || engine_broken_ ? Fault::kEngine
                                                 : Fault::kNone;
    if (sink.on_finish) sink.on_finish(r, kind, why, fault);
  });
}

StepLoop::~StepLoop() { stop(); }

void StepLoop::start() {
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "kvrt-step");
    run();
  });
}

void StepLoop::stop(const std::string& reason) {
  {
    std::lock_guard lock(mutex_);
    if (stopped_) return;
    stopping_ = true;
    inbox_.emplace_back([this, reason] { abort_all(reason); });
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  // Queries posted after the thread's last look run here, so no caller waits forever.
  std::deque<std::function<void()>> leftover;
  {
    std::lock_guard lock(mutex_);
    stopped_ = true;
    leftover.swap(inbox_);
  }
  for (auto& command : leftover) command();
}

bool StepLoop::post(std::function<void()> command, bool new_work) {
  {
    std::lock_guard lock(mutex_);
    // While stopping, queries and aborts still run on the step thread; new requests do not.
    if (stopped_ || (new_work && stopping_)) return false;
    inbox_.push_back(std::move(command));
  }
  wake_.notify_one();
  return true;
}

bool StepLoop::submit(serve::GenerateRequest request, RequestSink sink) {
  // Counted here, so a burst from many connections cannot overrun the bound between steps.
  if (unfinished_.fetch_add(1) >= max_unfinished_) {
    unfinished_.fetch_sub(1);
    return false;
  }
  auto shared = std::make_shared<std::pair<serve::GenerateRequest, RequestSink>>(
      std::move(request), std::move(sink));
  const bool queued = post(
      [this, shared] {
        sinks_.emplace(shared->first.id, std::move(shared->second));
        submitting_ = shared->first.id;
        core_.submit(std::move(shared->first));  // a refusal finishes it at once, in the sink
        submitting_ = 0;
      },
      /*new_work=*/true);
  if (!queued) unfinished_.fetch_sub(1);
  return queued;
}

void StepLoop::abort(uint64_t id, const std::string& reason) {
  post([this, id, reason] { core_.abort(id, reason); }, /*new_work=*/false);
}

void StepLoop::abort_all(const std::string& reason) {
  std::vector<uint64_t> ids;
  for (const auto& [id, sink] : sinks_) ids.push_back(id);
  for (uint64_t id : ids) core_.abort(id, reason);
}

void StepLoop::run() {
  for (;;) {
    std::deque<std::function<void()>> commands;
    {
      std::unique_lock lock(mutex_);
      // Sleep only with nothing to step and nothing to do.
      wake_.wait(lock, [&] { return !inbox_.empty() || stopping_ || !core_.idle(); });
      commands.swap(inbox_);
      if (stopping_ && commands.empty() && sinks_.empty()) return;
    }
    for (auto& command : commands) command();
    if (core_.idle()) continue;
    Result<sched::StepStats> step = core_.step();
    if (!step.ok()) {
      // The engine failed: the requests of the failed batch end with the reason (a retry would
      // fail the same way); the rest, and the loop, go on -- unless the engine broke for good
      // (its TP group failed), when nothing unfinished can finish and every request ends.
      const std::string why = "the engine failed: " + step.status().message();
      const bool newly_broken = !engine_broken_ && core_.engine_broken();
      engine_broken_ = engine_broken_ || newly_broken;
      const std::vector<uint64_t> failed = core_.scheduler().failed_batch();
      spdlog::error("step failed for {} requests: {}", failed.size(), step.status().message());
      for (uint64_t id : failed) {
        failing_ = id;
        core_.abort(id, why);
      }
      failing_ = 0;
      if (failed.empty() || engine_broken_) abort_all(why);
      if (newly_broken && on_engine_broken_) on_engine_broken_(step.status().message());
    }
  }
}

}  // namespace kvrt::server
