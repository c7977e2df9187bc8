// One step's attention on one rank, as each layer of an architecture's forward calls it, once a
// layer: the layer's new K/V rows go into the KV store (its write), then the attention plugin
// attends the step's query rows over the layer's KV, the new rows included (its run). The rank
// executor sets the step -- the new tokens' slots, where they are staged on the device, the
// attention plan's outcome -- before the forward; a layer only hands over rows.
//
// Under decode context parallelism (context_parallel.h) the rank keeps only its share of the
// tokens: it writes the new rows it keeps, gathers the query rows of its group's heads from the
// group, attends them over its own tokens (the plugin's run_lse), gathers the group's partial
// outputs and log-sum-exps and merges those of its own heads. Every rank of the TP group then
// takes part in two all-gathers a layer, so every layer must call attention() on every rank,
// failed or not (collective()).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/comm/communicator.h"
#include "core/parallel/context_parallel.h"
#include "core/plugin/attention.h"
#include "core/plugin/kv_store.h"
#include "core/util/status.h"

namespace kvrt::parallel {

class StepAttention {
 public:
  // `attention` is null on a rank without query heads (it writes and never attends). Both
  // outlive this object. With cp.on(): `comm` is the TP group's (it must outlive this object),
  // `attention` attends all of the group's query heads, cp.size times the rank's, and the rank
  // runs on the CPU (the merge reads host memory).
  StepAttention(plugin::KvStore* store, plugin::Attention* attention,
                comm::Communicator* comm = nullptr, ContextParallel cp = {})
      : store_(store), attention_(attention), comm_(comm), cp_(cp) {}

  // The step every layer's call uses: `slots` (valid until the next begin_step) for the new
  // rows `rows` (their indices among the step's rows, ascending; empty: every row, in order),
  // the same slots in device memory (null on the CPU), the stream the calls are ordered on
  // (null on the CPU) and the plan's status (a failed plan fails every layer's call, so the
  // forward still runs its collectives and returns it at the end).
  void begin_step(std::span<const int64_t> slots, std::span<const int32_t> rows,
                  const int64_t* device_slots, void* stream, Status plan) {
    slots_ = slots;
    rows_ = rows;
    device_slots_ = device_slots;
    stream_ = stream;
    plan_ = std::move(plan);
  }

  // Whether attention() meets the other ranks in collectives: then every layer calls it on
  // every rank, even after a failure (its result is then the failure).
  bool collective() const { return cp_.on(); }

  // `layer`'s attention over `num_rows` query rows: stores its new K and V rows (this rank's KV
  // heads; row i at k + i * kv_row_stride floats, the same for v; v null where the store keeps
  // one latent row a token, MLA's), then attends the query rows (q_row_stride apart) over the
  // layer's KV into `out` (out_row_stride apart). A failed write is returned without attending
  // (after the collectives, under context parallelism).
  Status attention(uint32_t layer, int64_t num_rows, const float* q, int64_t q_row_stride,
                   const float* k, const float* v, int64_t kv_row_stride, float* out,
                   int64_t out_row_stride);

 private:
  Status write(uint32_t layer, const float* k, const float* v, int64_t kv_row_stride);
  Status sharded(uint32_t layer, int64_t num_rows, const float* q, int64_t q_row_stride,
                 float* out, int64_t out_row_stride, Status written);

  plugin::KvStore* store_;
  plugin::Attention* attention_;
  comm::Communicator* comm_;
  ContextParallel cp_;
  std::span<const int64_t> slots_;
  std::span<const int32_t> rows_;
  const int64_t* device_slots_ = nullptr;
  void* stream_ = nullptr;
  Status plan_;
  // Context parallelism's scratch, grown as needed: the kept rows, the group's query rows, the
  // partial output and log-sum-exps, and what the group gathered.
  std::vector<float> kept_k_, kept_v_, q_mine_, q_all_, q_group_, partial_, gathered_;
};

}  // namespace kvrt::parallel
