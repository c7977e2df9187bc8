/*
 * kvrt attention table.
 *
 * An attention plugin computes softmax(Q K^T * scale) V for a batch of sequences whose K/V live
 * in a KV store's pages, read through the store's kvrt_kv_layout. The batch is described as CSR
 * arrays in the FlashInfer style. Prefill and decode are the same call (decode: one query row
 * per sequence). The new tokens' K/V are written to the store before run().
 *
 * Lifecycle: create once per layer shape; plan() once per batch (writes into a caller-owned
 * workspace); run() once per layer with that plan. run() never allocates.
 * Thread-safety: one handle is used by one thread at a time; distinct handles are independent.
 *
 * Context parallelism (ABI 1.4, optional): when a sequence's tokens are spread over N ranks
 * (decode context parallelism: each of N ranks that would hold the same KV keeps every N-th
 * token), each rank attends its own tokens with plan_sharded() and run_lse(), and the core
 * merges the N partial outputs with their log-sum-exps (out = sum_i exp(lse_i - lse) out_i,
 * lse = log sum_i exp(lse_i)), exactly.
 */
#ifndef KVRT_ATTENTION_H
#define KVRT_ATTENTION_H

#include "kvrt/abi.h"
#include "kvrt/kv_store.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvrt_attention kvrt_attention; /* opaque, the plugin's */

typedef struct kvrt_attention_params {
  uint32_t struct_size;
  uint32_t num_q_heads;  /* this rank's query heads */
  uint32_t num_kv_heads; /* this rank's KV heads; num_q_heads % num_kv_heads == 0 */
  uint32_t qk_head_dim;
  uint32_t v_head_dim;
  float softmax_scale; /* usually 1 / sqrt(qk_head_dim) */
  kvrt_device device;
  /* (ABI 1.1) V's first element within each head's V row -- its K row when the layout's
   * v_head_dim is 0 (MLA: V is elements [v_offset, v_offset + v_head_dim) of the latent).
   * v_head_dim is V's width and the output's. 0 from an ABI 1.0 host. */
  uint32_t v_offset;
  uint32_t reserved;
} kvrt_attention_params;

/* One batch, CSR. Sequence b has query rows qo_indptr[b] .. qo_indptr[b+1] (its newest tokens)
 * and KV pages kv_page_indices[kv_page_indptr[b] .. kv_page_indptr[b+1]], the last of which
 * holds kv_last_page_len[b] tokens (1..page_size). With causal != 0, query row i of sequence b
 * sees the KV positions up to (kv_len - q_len + i). Arrays are host memory, caller-owned, and
 * must stay valid until the next plan(). */
typedef struct kvrt_attention_batch {
  uint32_t struct_size;
  uint32_t batch_size;
  uint32_t page_size;
  uint32_t causal;
  const int32_t *qo_indptr;        /* [batch_size + 1] */
  const int32_t *kv_page_indptr;   /* [batch_size + 1] */
  const int32_t *kv_page_indices;  /* [kv_page_indptr[batch_size]] */
  const int32_t *kv_last_page_len; /* [batch_size] */
} kvrt_attention_batch;

/* (ABI 1.4) Which of a sequence's tokens this rank keeps, for plan_sharded(). The sequence's
 * tokens are dealt out in runs of `interleave` positions: global run r (positions
 * [r * interleave, (r + 1) * interleave)) is kept by shard r % count. The batch's pages and
 * last-page lengths then describe only this shard's tokens, in position order: its local token j
 * (counted over the sequence's pages, as usual) is the token at global position
 *   (j / interleave * count + index) * interleave + j % interleave.
 * A sequence may keep no token here: no pages (equal kv_page_indptr entries), and its
 * kv_last_page_len is then 0. kv_len[b] is sequence b's length over all shards; with q_len query
 * rows, row i is the token at global position kv_len[b] - q_len + i and, when causal, sees the
 * tokens up to that position. The local lengths must be exactly what the shard keeps of
 * kv_len[b] positions. */
typedef struct kvrt_attention_shard {
  uint32_t struct_size;
  uint32_t count;      /* N >= 1 ranks share each sequence's tokens */
  uint32_t index;      /* this rank's shard, 0 .. count - 1 */
  uint32_t interleave; /* positions per run, >= 1 (kvrt deals out single tokens: 1) */
  const int32_t *kv_len; /* [batch_size] each sequence's KV length over all shards */
} kvrt_attention_shard;

/* One layer's call. Q rows are [num_q_heads][qk_head_dim] of q_dtype; out rows
 * [num_q_heads][v_head_dim] of out_dtype; row i at base + i * *_row_stride elements (0 = dense).
 * The store and layer are given so a plugin can fall back to the store's gather() when it
 * cannot read `layout` natively. */
typedef struct kvrt_attention_run_args {
  uint32_t struct_size;
  uint32_t layer;
  kvrt_dtype q_dtype;
  kvrt_dtype out_dtype;
  const kvrt_kv_layout *layout;
  const kvrt_kv_store_api *store_api;
  const kvrt_kv_store *store;
  const void *q;
  void *out;
  int64_t q_row_stride;
  int64_t out_row_stride;
  void *stream; /* cudaStream_t on CUDA; NULL on CPU */
} kvrt_attention_run_args;

typedef struct kvrt_attention_api {
  uint32_t struct_size;
  uint32_t reserved;

  /* ===== required ===== */

  /* New handle for one layer shape. KVRT_ERR_UNSUPPORTED (message names the field) for head
   * counts or dims it does not serve. */
  kvrt_status (*create)(const kvrt_host_api *host, const kvrt_attention_params *params,
                        const kvrt_config *config, kvrt_attention **out);

  void (*destroy)(kvrt_attention *attn); /* NULL is a no-op */

  /* KVRT_OK if run() reads `layout` natively; KVRT_ERR_UNSUPPORTED with a reason (set_error)
   * otherwise, in which case run() must still work through the store's gather(). */
  kvrt_status (*supports)(const kvrt_attention *attn, const kvrt_kv_layout *layout);

  /* Bytes of workspace plan() needs for a batch of this shape (upper bound). */
  kvrt_status (*workspace_size)(const kvrt_attention *attn, const kvrt_attention_batch *batch,
                                uint64_t *out_bytes);

  /* Splits the batch into work items (e.g. over pages for long contexts) inside `workspace`,
   * which the caller owns and keeps alive and unchanged until the next plan(). */
  kvrt_status (*plan)(kvrt_attention *attn, const kvrt_attention_batch *batch, void *workspace,
                      uint64_t workspace_bytes);

  /* Computes attention for the planned batch. Never allocates. */
  kvrt_status (*run)(kvrt_attention *attn, const kvrt_attention_run_args *args);

  /* ===== ABI 1.4 (optional, both or neither): context parallelism =====
   * A plugin without them cannot serve tp.dcp_size > 1 (the core refuses it at start, naming
   * the plugin). */

  /* plan() for a batch of which this rank keeps the shard `shard` describes (see
   * kvrt_attention_shard): query rows see only this shard's tokens, masked by their global
   * positions. workspace_size(batch) bounds the workspace it needs. */
  kvrt_status (*plan_sharded)(kvrt_attention *attn, const kvrt_attention_batch *batch,
                              const kvrt_attention_shard *shard, void *workspace,
                              uint64_t workspace_bytes);

  /* run(), after plan() or plan_sharded(), that also writes each query row's log-sum-exp per
   * head: lse[row * lse_row_stride + head] = log(sum over the KV tokens the row sees of
   * exp(score)), score = (q . k) * softmax_scale over the dequantized K, natural log, f32 in the
   * memory `out` is in (lse_row_stride in floats; 0 = num_q_heads). A row that sees no token (a shard that
   * keeps none of those it may see) gets -INFINITY there and zeros in `out`. */
  kvrt_status (*run_lse)(kvrt_attention *attn, const kvrt_attention_run_args *args, float *lse,
                         int64_t lse_row_stride);
} kvrt_attention_api;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVRT_ATTENTION_H */
