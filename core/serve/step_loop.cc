#include "core/serve/step_loop.h"

#include <pthread.h>
#include <spdlog/spdlog.h>

namespace kvrt::serve {

StepLoop::StepLoop(ServingCore& core, const StepLoopOptions& options)
    : core_(core),
      options_(options),
      max_unfinished_(options.max_queued_requests + options.max_running_requests),
      snapshot_(std::make_shared<const LoopSnapshot>()) {}

StepLoop::~StepLoop() { stop(); }

void StepLoop::start() {
  publish();
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
    inbox_.emplace_back([this, reason] { core_.abort_all(reason); });
  }
  wake_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
  } else {
    // Never started: the abort runs here, so every sink still hears its end.
    std::deque<std::function<void()>> commands;
    {
      std::lock_guard lock(mutex_);
      commands.swap(inbox_);
    }
    for (auto& command : commands) command();
    flush_outbox();
  }
  // Commands posted after the thread's last look run here, so no caller waits forever.
  std::deque<std::function<void()>> leftover;
  {
    std::lock_guard lock(mutex_);
    stopped_ = true;
    leftover.swap(inbox_);
  }
  for (auto& command : leftover) command();
  flush_outbox();
}

bool StepLoop::post(std::function<void()> command, bool new_work) {
  {
    std::lock_guard lock(mutex_);
    // While stopping, commands and aborts still run on the step thread; new requests do not.
    if (stopped_ || (new_work && stopping_)) return false;
    inbox_.push_back(std::move(command));
  }
  wake_.notify_one();
  return true;
}

Status StepLoop::submit(GenerateRequest request, RequestSink sink) {
  std::vector<std::pair<GenerateRequest, RequestSink>> one;
  one.emplace_back(std::move(request), std::move(sink));
  return submit(std::move(one));
}

Status StepLoop::submit(std::vector<std::pair<GenerateRequest, RequestSink>> batch,
                        size_t* refused) {
  if (batch.size() > max_unfinished_) {
    return Status::BadField(
        "batch", std::to_string(batch.size()) +
                     " prompts can never be held at once: max_queued_requests (" +
                     std::to_string(options_.max_queued_requests) + ") + max_running_requests (" +
                     std::to_string(options_.max_running_requests) + ") = " +
                     std::to_string(max_unfinished_));
  }
  // Checked here, on the caller's thread, so the step thread never spends time on a refusal.
  for (size_t i = 0; i < batch.size(); ++i) {
    if (Status s = core_.check_request(batch[i].first); !s.ok()) {
      if (refused != nullptr) *refused = i;
      return s;
    }
  }
  // Counted here, all at once, so a burst from many connections cannot overrun the bound
  // between steps and a batch is never half admitted.
  if (unfinished_.fetch_add(batch.size()) + batch.size() > max_unfinished_) {
    unfinished_.fetch_sub(batch.size());
    return Status::NoMemory("the waiting queue is full (max_queued_requests " +
                            std::to_string(options_.max_queued_requests) + " + max_running_requests " +
                            std::to_string(options_.max_running_requests) + "); retry later");
  }
  auto shared = std::make_shared<std::vector<std::pair<GenerateRequest, RequestSink>>>(
      std::move(batch));
  const size_t n = shared->size();
  const bool queued = post(
      [this, shared] {
        for (auto& [request, sink] : *shared) {
          auto target = std::make_shared<const RequestSink>(std::move(sink));
          // Held back until the step (or command) is over and, for an end, the snapshot shows it.
          RequestSink hold = [this, target](RequestOutput out) {
            outbox_has_end_ = outbox_has_end_ || out.finished;
            outbox_.emplace_back(target, std::move(out));
          };
          const uint64_t id = request.id;
          if (Status s = core_.submit_checked(std::move(request), std::move(hold)); !s.ok()) {
            // check_request passed on the caller's thread: only a duplicate id gets here.
            spdlog::error("request {}: {}", id, s.message());
            RequestOutput end;
            end.id = id;
            end.finished = true;
            end.finish_reason = FinishReason::kAborted;
            end.message = s.message();
            outbox_has_end_ = true;
            outbox_.emplace_back(target, std::move(end));
          }
        }
      },
      /*new_work=*/true);
  if (!queued) {
    unfinished_.fetch_sub(n);
    return Status::Internal("the server is shutting down");
  }
  return Status::Ok();
}

void StepLoop::abort(uint64_t id, const std::string& reason) {
  post([this, id, reason] { core_.abort(id, reason); }, /*new_work=*/false);
}

std::shared_ptr<const LoopSnapshot> StepLoop::snapshot() const {
  std::lock_guard lock(snapshot_mutex_);
  return snapshot_;
}

void StepLoop::publish() {
  auto s = std::make_shared<LoopSnapshot>();
  s->prometheus = core_.prometheus();
  if (describe_) s->description = describe_(core_);
  s->running = core_.scheduler().num_running();
  s->waiting = core_.scheduler().num_waiting();
  s->tokens_in_use = core_.scheduler().tokens_in_use();
  s->engine_broken = core_.engine_broken();
  published_ = std::chrono::steady_clock::now();
  std::lock_guard lock(snapshot_mutex_);
  snapshot_ = std::move(s);
}

void StepLoop::flush_outbox() {
  if (outbox_.empty()) return;
  if (outbox_has_end_) publish();
  std::vector<std::pair<std::shared_ptr<const RequestSink>, RequestOutput>> outputs;
  outputs.swap(outbox_);
  outbox_has_end_ = false;
  for (auto& [sink, out] : outputs) {
    if (out.finished) unfinished_.fetch_sub(1);
    if (*sink) (*sink)(std::move(out));
  }
}

void StepLoop::run() {
  for (;;) {
    std::deque<std::function<void()>> commands;
    {
      std::unique_lock lock(mutex_);
      if (inbox_.empty() && !stopping_ && core_.idle()) {
        lock.unlock();
        publish();  // the state the loop sleeps in
        lock.lock();
      }
      // Sleep only with nothing to step and nothing to do.
      wake_.wait(lock, [&] { return !inbox_.empty() || stopping_ || !core_.idle(); });
      commands.swap(inbox_);
      if (stopping_ && commands.empty() && core_.unfinished() == 0) return;
    }
    for (auto& command : commands) command();
    flush_outbox();
    if (core_.idle()) continue;
    Result<sched::StepStats> step = core_.step();
    const bool newly_broken = !step.ok() && !engine_broken_ && core_.engine_broken();
    engine_broken_ = engine_broken_ || newly_broken;
    if (std::chrono::steady_clock::now() - published_ >= options_.snapshot_interval) publish();
    flush_outbox();
    if (newly_broken && on_engine_broken_) on_engine_broken_(step.status().message());
  }
}

}  // namespace kvrt::serve
