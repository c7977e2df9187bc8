// The arithmetic of paged attention that attn_cpu and a CUDA attention share: where a position's
// row is, how a long decode splits into chunks of whole pages (flash-decoding), and how the
// chunks' partial softmax states merge.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/shared/host_device.h"

namespace kvrt::kernels::shared {

// Position `pos` of a sequence whose pages are page_indices[0..]: its page and its offset there.
struct PagePosition {
  int64_t page;
  int64_t offset;
};
KVRT_HD PagePosition locate(const int32_t* page_indices, int64_t page_size, int64_t pos) {
  return {page_indices[pos / page_size], pos % page_size};
}

// Byte offset of head `head`'s row at (page, offset) in a layout with these strides (bytes), as
// kvrt_kv_layout states them.
KVRT_HD int64_t row_offset(PagePosition at, int64_t page_stride, int64_t token_stride,
                           int64_t head, int64_t head_stride) {
  return at.page * page_stride + at.offset * token_stride + head * head_stride;
}

// The KV slot (page * page_size + offset) the scheduler and the stores index by, and back.
KVRT_HD int64_t slot_of(PagePosition at, int64_t page_size) {
  return at.page * page_size + at.offset;
}
KVRT_HD PagePosition position_of_slot(int64_t slot, int64_t page_size) {
  return {slot / page_size, slot % page_size};
}

// Split planning: a row over more than `chunk_tokens` positions is split into chunks of whole
// pages (chunk_tokens rounded up to the page size); chunk c covers [c * chunk, min(end, (c + 1) *
// chunk)).
KVRT_HD int64_t split_chunk(int64_t chunk_tokens, int64_t page_size) {
  return (chunk_tokens + page_size - 1) / page_size * page_size;
}
KVRT_HD int64_t split_count(int64_t end, int64_t chunk) {
  return end > chunk ? (end + chunk - 1) / chunk : 1;
}

// The flash-decoding merge of chunk states: chunk c has running max m_c (-inf when the row sees
// none of it), sum s_c and unnormalised output o_c. With M = max m_c, chunk c weighs
// exp(m_c - M) (0 for -inf), the merged sum is sum w_c s_c and the output sum w_c o_c / that.
KVRT_HD float merge_weight(float chunk_max, float max) {
  return chunk_max == -INFINITY ? 0.0f : expf(chunk_max - max);
}

}  // namespace kvrt::kernels::shared
