// One step's attention on one rank, as each layer of an architecture's forward calls it, once a
// layer: the layer's new K/V rows go into the KV store (its write), then the attention plugin
// attends the step's query rows over the layer's KV, the new rows included (its run). The rank
// executor sets the step -- the new tokens' slots, where they are staged on the device, the
// attention plan's outcome -- before the forward; a layer only hands over rows.
#pragma once

#include <cstdint>
#include <span>

#include "core/plugin/attention.h"
#include "core/plugin/kv_store.h"
#include "core/util/status.h"

namespace kvrt::plugin {

class StepAttention {
 public:
  // `attention` is null on a rank without query heads (it writes and never attends). Both
  // outlive this object.
  StepAttention(KvStore* store, Attention* attention) : store_(store), attention_(attention) {}

  // The step every layer's call uses: `slots` (valid until the next begin_step), the same slots
  // in device memory (null on the CPU), the stream the calls are ordered on (null on the CPU)
  // and the plan's status (a failed plan fails every layer's call, so the forward still runs
  // its collectives and returns it at the end).
  void begin_step(std::span<const int64_t> slots, const int64_t* device_slots, void* stream,
                  Status plan) {
    slots_ = slots;
    device_slots_ = device_slots;
    stream_ = stream;
    plan_ = std::move(plan);
  }

  // `layer`'s attention: stores its new K and V rows (this rank's KV heads; row i at
  // k + i * kv_row_stride floats, the same for v; v null where the store keeps one latent row a
  // token, MLA's), then attends the query rows (q_row_stride apart) over the layer's KV into
  // `out` (out_row_stride apart). A failed write is returned without attending.
  Status attention(uint32_t layer, const float* q, int64_t q_row_stride, const float* k,
                   const float* v, int64_t kv_row_stride, float* out, int64_t out_row_stride);

 private:
  KvStore* store_;
  Attention* attention_;
  std::span<const int64_t> slots_;
  const int64_t* device_slots_ = nullptr;
  void* stream_ = nullptr;
  Status plan_;
};

}  // namespace kvrt::plugin
