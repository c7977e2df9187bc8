#include "core/plugin/step_attention.h"

namespace kvrt::plugin {

Status StepAttention::attention(uint32_t layer, const float* q, int64_t q_row_stride,
                                const float* k, const float* v, int64_t kv_row_stride, float* out,
                                int64_t out_row_stride) {
  if (!plan_.ok()) return plan_;
  kvrt_kv_write w{};
  w.struct_size = sizeof(w);
  w.layer = layer;
  w.dtype = KVRT_DTYPE_F32;
  w.num_tokens = static_cast<uint32_t>(slots_.size());
  w.slots = slots_.data();
  w.k = k;
  w.v = v;
  w.k_token_stride = w.v_token_stride = kv_row_stride;
  w.device_slots = device_slots_;
  w.stream = stream_;
  if (Status s = store_->write(w); !s.ok()) return s;
  kvrt_attention_run_args args{};
  args.layer = layer;
  args.q_dtype = args.out_dtype = KVRT_DTYPE_F32;
  args.q = q;
  args.out = out;
  args.q_row_stride = q_row_stride;
  args.out_row_stride = out_row_stride;
  args.stream = stream_;
  return attention_->run(*store_, store_->checked_layout(layer), args);
}

}  // namespace kvrt::plugin
