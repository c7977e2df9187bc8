// attn_cpu: attention on the CPU over the pages of any KV store.
//
// Reads K/V natively through the store's layout when their dtypes are f32, bf16 or FP8 E4M3
// with no scale, a per-tensor scale or per-token-head scales (the shipped stores' formats), and
// through the store's gather() otherwise (a third-party format: slower, still correct; on all
// of the rank's threads when the store's format says its gather() is thread-safe).
// v_head_dim 0 in the layout (an MLA latent) means V is in the K row: its first v_width values
// (the attention's v_head_dim; 0 there means all of K), and the output has that many per head.
//
// plan() splits the batch into work items in the caller's workspace: blocks of up to kRowBlock
// query rows of one sequence, each over the KV positions its rows can see (causal masking
// trims the end). Items of at most kSplitMaxRows rows (decode, short speculative chunks) over
// more than decode_chunk_tokens positions are split over chunks of whole pages, flash-decoding
// style: each chunk keeps its own running max, sum and unnormalised output, and a merge step
// combines them. run() spreads the items over the rank's OpenMP threads and walks each in tiles
// of kTile positions; per tile, the SIMD kernels of kernels/cpu/attention.h go token by token
// over all KV heads (address order in a token-major page), score every query head of a group
// against its K row once and add each V row once to all of the group's outputs.
// run() allocates nothing: all scratch lives in the workspace.
// Context parallelism (ABI 1.4): plan_sharded() plans a batch of which this rank keeps one shard
// of each sequence's tokens; a row's causal limit is then the number of its shard's tokens at or
// before its global position. run_lse() also writes each row's log-sum-exp per head (a row that
// sees no token here: zeros and -inf), from the same running max and sum.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/convert.h"
#include "kernels/shared/paged_attention.h"
#include "kvrt/plugin.hpp"

namespace kvrt::plugins {
namespace {

using kernels::KvElem;

constexpr uint32_t kQDtypes = KVRT_DTYPE_BIT(KVRT_DTYPE_F32) | KVRT_DTYPE_BIT(KVRT_DTYPE_BF16);
constexpr uint32_t kTile = 32;         // KV positions per kernel call: scores stay in L1
constexpr uint32_t kRowBlock = 16;     // query rows per work item: K/V tiles are reused from cache
constexpr uint32_t kSplitMaxRows = 4;  // items up to this many rows split long contexts
// Items of at least this many rows (prefill) decode each tile once, K transposed and V as f32
// rows, for kernels::qk_dots_transposed and pv_accumulate_tile; the decoding costs about what
// 5 rows' scores save.
constexpr int32_t kSharedTileMinRows = 8;
// A decode row whose KV head serves this many query heads (MLA's latent: all of them) shares
// each tile as much: the tile path then pays for itself too.
constexpr uint32_t kSharedTileMinGroup = 8;
// Decode prefetches K this many positions ahead of the scores (see run_item).
constexpr uint32_t kPrefetchTokens = 8;
constexpr uint32_t kMaxHeadDim = 4096;
constexpr int64_t kDefaultChunkTokens = 256;
constexpr uint64_t kAlign = 64;
constexpr uint64_t kMagic = 0x316e74617472766bull;  // "kvrtatn1"
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

uint64_t align_up(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

using sdk::dtype_name;

bool native_dtype(kvrt_dtype d) {
  return d == KVRT_DTYPE_F32 || d == KVRT_DTYPE_BF16 || d == KVRT_DTYPE_FP8_E4M3;
}

KvElem kv_elem(kvrt_dtype d) {
  return d == KVRT_DTYPE_F32 ? KvElem::kF32 : d == KVRT_DTYPE_BF16 ? KvElem::kBf16 : KvElem::kE4M3;
}

// One block of query rows of one sequence over KV positions [kv_begin, kv_end).
struct WorkItem {
  int32_t row_begin;  // index of its first query row in Q and out
  int32_t rows;       // query rows
  int32_t first_pos;  // causal: its first row's global position (row r's is first_pos + r; it
                      // sees the shard's tokens up to there); otherwise the last KV position
                      // every row sees
  int32_t kv_begin;
  int32_t kv_end;
  int32_t page_base;  // index in kv_page_indices of the sequence's first page
  int32_t merge;      // the merge this chunk feeds, or -1: the item writes out itself
  int32_t reserved;
  uint64_t partial;  // split items: workspace offset of the chunk's max, sum and output
};

// Combines the chunks (consecutive items) of one split block of rows.
struct Merge {
  int32_t row_begin;
  int32_t rows;
  int32_t first_item;
  int32_t num_items;
};

// The workspace starts with this, then the items, the merges, the chunks' partial states and
// the scratch run() works in.
struct PlanHeader {
  uint64_t magic;
  uint32_t num_items;
  uint32_t num_merges;
  uint32_t page_size;
  uint32_t causal;
  int64_t total_rows;  // query rows of the batch: qo_indptr[batch_size]
  int64_t first_page;  // kv_page_indices entries in use: [first_page, end_page)
  int64_t end_page;
  const int32_t* page_indices;
  uint64_t items_offset;
  uint64_t merges_offset;
  uint64_t scratch_offset;
  uint64_t scratch_stride;  // run()'s scratch per thread
  uint32_t threads;         // threads planned for: OpenMP's max for the planning thread
  uint32_t batch_size;
  uint64_t total_bytes;
  uint32_t shard_count;  // 1 unless planned by plan_sharded()
  uint32_t shard_index;
  uint32_t shard_interleave;
  uint32_t reserved;
};

class CpuAttention : public sdk::AttentionBase {
 public:
  CpuAttention(const kvrt_host_api* host, const kvrt_attention_params& p, sdk::ConfigView config)
      : AttentionBase(host, p) {
    if (p.device.kind != KVRT_DEVICE_CPU) {
      sdk::fail(KVRT_ERR_UNSUPPORTED, "attn_cpu serves CPU devices only");
    }
    if (p.num_q_heads == 0 || p.num_kv_heads == 0) {
      sdk::fail(KVRT_ERR_INVALID_ARGUMENT, "num_q_heads and num_kv_heads must be >= 1");
    }
    if (p.num_q_heads % p.num_kv_heads != 0) {
      sdk::fail(KVRT_ERR_INVALID_ARGUMENT, "num_q_heads " + std::to_string(p.num_q_heads) +
                                               " is not a multiple of num_kv_heads " +
                                               std::to_string(p.num_kv_heads));
    }
    if (p.qk_head_dim == 0) sdk::fail(KVRT_ERR_INVALID_ARGUMENT, "qk_head_dim is 0");
    check_dim("qk_head_dim", p.qk_head_dim);
    if (p.v_head_dim != 0) check_dim("v_head_dim", p.v_head_dim);
    if (p.v_offset != 0) {
      // V starting inside the K row (ABI 1.1, MLA-style) is not read by these kernels yet.
      sdk::fail(KVRT_ERR_UNSUPPORTED,
                "v_offset " + std::to_string(p.v_offset) + ": V must start its row (v_offset 0)");
    }
    if (!std::isfinite(p.softmax_scale)) {
      sdk::fail(KVRT_ERR_INVALID_ARGUMENT, "softmax_scale is not finite");
    }
    const int64_t chunk = config.integer("decode_chunk_tokens", kDefaultChunkTokens);
    if (chunk < 1 || chunk > (int64_t{1} << 30)) {
      sdk::fail(KVRT_ERR_CONFIG,
                "decode_chunk_tokens: expected 1 .. 2^30, found " + std::to_string(chunk));
    }
    chunk_tokens_ = static_cast<uint32_t>(chunk);
    q_heads_ = p.num_q_heads;
    kv_heads_ = p.num_kv_heads;
    group_ = q_heads_ / kv_heads_;
    qk_dim_ = p.qk_head_dim;
    v_dim_ = p.v_head_dim == 0 ? p.qk_head_dim : p.v_head_dim;
    layout_scratch();
  }

  void supports(const kvrt_kv_layout& layout) const {
    if (std::string why = shape_mismatch(layout); !why.empty()) {
      sdk::fail(KVRT_ERR_UNSUPPORTED, why);
    }
    if (!readable(layout)) sdk::fail(KVRT_ERR_UNSUPPORTED, not_native(layout));
  }

  // Bounds plan() and plan_sharded() of the batch alike.
  uint64_t workspace_size(const kvrt_attention_batch& batch) const {
    // kAlign: room to align the start
    return layout_plan(count(batch, sdk::Shard::any())).total_bytes + kAlign;
  }

  void plan(const kvrt_attention_batch& batch, void* workspace, uint64_t workspace_bytes) {
    plan_sharded(batch, sdk::Shard{}, workspace, workspace_bytes);
  }

  void plan_sharded(const kvrt_attention_batch& batch, const sdk::Shard& shard, void* workspace,
                    uint64_t workspace_bytes) {
    plan_ = nullptr;  // a failed plan leaves nothing to run
    const Counts counts = count(batch, shard);
    PlanHeader header = layout_plan(counts);
    const uint64_t needed = header.total_bytes + kAlign;
    if (workspace == nullptr) sdk::fail(KVRT_ERR_INVALID_ARGUMENT, "workspace is NULL");
    if (workspace_bytes < needed) {
      sdk::fail(KVRT_ERR_INVALID_ARGUMENT,
                "workspace of " + std::to_string(workspace_bytes) +
                    " bytes is smaller than workspace_size() = " + std::to_string(needed));
    }
    auto* base = reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<uintptr_t>(workspace)));
    header.magic = kMagic;
    header.page_size = batch.page_size;
    header.causal = batch.causal != 0;
    header.batch_size = batch.batch_size;
    header.shard_count = shard.count;
    header.shard_index = shard.index;
    header.shard_interleave = shard.interleave;
    header.page_indices = batch.kv_page_indices;
    if (batch.batch_size > 0) {
      header.first_page = batch.kv_page_indptr[0];
      header.end_page = batch.kv_page_indptr[batch.batch_size];
      header.total_rows = batch.qo_indptr[batch.batch_size];
    }
    auto* items = reinterpret_cast<WorkItem*>(base + header.items_offset);
    auto* merges = reinterpret_cast<Merge*>(base + header.merges_offset);
    uint64_t partial = header.merges_offset + align_up(sizeof(Merge) * counts.merges);
    uint32_t num_items = 0, num_merges = 0;
    walk(
        batch, shard,
        [&](const WorkItem& item) {
          WorkItem& w = items[num_items++];
          w = item;
          if (item.merge >= 0) {  // a chunk of the merge that follows its chunks
            w.merge = static_cast<int32_t>(num_merges);
            w.partial = partial;
            partial += partial_bytes(static_cast<uint32_t>(item.rows));
          }
        },
        [&](const Merge& m) {
          Merge& w = merges[num_merges++];
          w = m;
          w.first_item = static_cast<int32_t>(num_items) - m.num_items;
        });
    header.num_items = num_items;
    header.num_merges = num_merges;
    std::memcpy(base, &header, sizeof(header));
    plan_ = base;
  }

  void run(const kvrt_attention_run_args& args) { run_lse(args, nullptr, 0); }

  // lse null: run() alone.
  void run_lse(const kvrt_attention_run_args& args, float* lse, int64_t lse_row_stride) {
    if (plan_ == nullptr) sdk::fail(KVRT_ERR_INVALID_ARGUMENT, "run() without a successful plan()");
    PlanHeader header;
    std::memcpy(&header, plan_, sizeof(header));
    if (header.magic != kMagic) {
      sdk::fail(KVRT_ERR_INVALID_ARGUMENT, "the workspace was changed since plan()");
    }
    const kvrt_kv_layout& layout = *args.layout;
    Layer layer = prepare(args, layout, header);
    layer.lse = lse;
    layer.lse_stride = lse_row_stride == 0 ? q_heads_ : lse_row_stride;
    if (lse != nullptr && layer.lse_stride < q_heads_) {
      sdk::fail(KVRT_ERR_INVALID_ARGUMENT, "lse_row_stride " + std::to_string(lse_row_stride) +
                                               " is shorter than a row's " +
                                               std::to_string(q_heads_) + " heads");
    }
    const auto* items = reinterpret_cast<const WorkItem*>(plan_ + header.items_offset);
    const auto* merges = reinterpret_cast<const Merge*>(plan_ + header.merges_offset);
    // Work items write disjoint rows or partials, so they run in parallel, each thread in its
    // own scratch (the gathered rows included). Through gather() only when the store's format
    // says KVRT_KV_GATHER_THREAD_SAFE (ABI 1.3); serial otherwise. (The host runs its BLAS
    // single-threaded inside its own OpenMP threads, so these share one pool with the matrix
    // products.)
    const bool parallel = layer.native || layer.parallel_gather;
    const int threads = parallel ? static_cast<int>(header.threads) : 1;
    bool failed = false;
    kvrt_status status = KVRT_OK;
    std::string message;
#pragma omp parallel num_threads(threads) if (threads > 1 && header.num_items > 1)
    {
      Layer mine = layer;
      mine.scratch += header.scratch_stride * static_cast<uint64_t>(omp_get_thread_num());
#pragma omp for schedule(dynamic)
      for (uint32_t i = 0; i < header.num_items; ++i) {
        try {
          run_item(mine, header, items[i]);
        } catch (const sdk::Error& e) {  // exceptions must not leave an OpenMP region
#pragma omp critical(attn_cpu_failure)
          if (!failed) failed = true, status = e.status(), message = e.what();
        } catch (const std::exception& e) {
#pragma omp critical(attn_cpu_failure)
          if (!failed) failed = true, status = KVRT_ERR_INTERNAL, message = e.what();
        }
      }
    }
    if (failed) sdk::fail(status, message);
    for (uint32_t i = 0; i < header.num_merges; ++i) run_merge(layer, items, merges[i]);
  }

 private:
  struct Counts {
    uint64_t items = 0, merges = 0, partial_bytes = 0;
  };

  // Byte offsets of run()'s scratch, fixed by the shape; see layout_scratch().
  struct Scratch {
    uint64_t state, q, scores, rescale, s_off, k_rows, v_rows, k_ahead, k_scales, v_scales, slots,
        gathered_k, gathered_v, out_row, kt, vt, total;
  };

  // What run() needs about the layer, checked once.
  struct Layer {
    const kvrt_attention_run_args* args;
    const kvrt_kv_layout* layout;
    bool native;
    bool parallel_gather;  // gather() may run on several threads (the store's format says so)
    KvElem k_type, v_type;
    float score_scale;  // softmax_scale times a per-tensor K scale
    float out_scale;    // a per-tensor V scale
    bool token_scales;  // per-token-head scales
    int64_t q_stride, out_stride;
    uint8_t* scratch;
    float* lse;          // run_lse's output, or null
    int64_t lse_stride;  // floats between rows of lse
  };

  // A query row block's running max [rows][q_heads], sum (likewise) and output
  // [rows][q_heads][v_dim], in the scratch or in a chunk's partial.
  struct State {
    float* max;
    float* sum;
    float* acc;
  };

  static void check_dim(const char* name, uint32_t dim) {
    if (dim % kernels::kDimMultiple != 0 || dim > kMaxHeadDim) {
      sdk::fail(KVRT_ERR_UNSUPPORTED, std::string(name) + " " + std::to_string(dim) +
                                          " not served: attn_cpu takes multiples of " +
                                          std::to_string(kernels::kDimMultiple) + " up to " +
                                          std::to_string(kMaxHeadDim));
    }
  }

  uint64_t state_floats(uint32_t rows) const { return uint64_t{rows} * q_heads_ * (v_dim_ + 2); }
  uint64_t partial_bytes(uint32_t rows) const { return align_up(4 * state_floats(rows)); }

  State state_at(uint8_t* p, uint32_t rows) const {
    auto* f = reinterpret_cast<float*>(p);
    const uint64_t n = uint64_t{rows} * q_heads_;
    return {f, f + n, f + 2 * n};
  }

  void layout_scratch() {
    uint64_t at = 0;
    auto take = [&](uint64_t bytes) {
      const uint64_t offset = at;
      at += align_up(bytes);
      return offset;
    };
    const uint64_t kv_row_floats = uint64_t{kTile} * kv_heads_;
    scratch_.state = take(4 * state_floats(kRowBlock));
    scratch_.q = take(4 * uint64_t{kRowBlock} * q_heads_ * qk_dim_);
    scratch_.scores = take(4 * uint64_t{q_heads_} * kTile);
    scratch_.rescale = take(4 * uint64_t{q_heads_});
    scratch_.s_off = take(8 * kTile);
    scratch_.k_rows = take(sizeof(void*) * kTile);
    scratch_.v_rows = take(sizeof(void*) * kTile);
    scratch_.k_ahead = take(sizeof(void*) * kTile);
    scratch_.k_scales = take(4 * kv_row_floats);
    scratch_.v_scales = take(4 * kv_row_floats);
    scratch_.slots = take(8 * kTile);
    scratch_.gathered_k = take(4 * kv_row_floats * qk_dim_);
    scratch_.gathered_v = take(params().v_head_dim == 0 ? 0 : 4 * kv_row_floats * v_dim_);
    scratch_.out_row = take(4 * uint64_t{v_dim_});
    scratch_.kt = take(4 * kv_row_floats * qk_dim_);
    scratch_.vt = take(4 * kv_row_floats * v_dim_);
    scratch_.total = at;
  }

  Counts count(const kvrt_attention_batch& batch, const sdk::Shard& shard) const {
    Counts counts;
    walk(
        batch, shard, [&](const WorkItem&) { ++counts.items; },
        [&](const Merge& m) {
          ++counts.merges;
          counts.partial_bytes += partial_bytes(static_cast<uint32_t>(m.rows)) * m.num_items;
        });
    return counts;
  }

  PlanHeader layout_plan(const Counts& c) const {
    PlanHeader h{};
    h.items_offset = align_up(sizeof(PlanHeader));
    h.merges_offset = h.items_offset + align_up(sizeof(WorkItem) * c.items);
    h.scratch_offset = h.merges_offset + align_up(sizeof(Merge) * c.merges) + c.partial_bytes;
    h.scratch_stride = align_up(scratch_.total);
    h.threads = static_cast<uint32_t>(std::max(1, omp_get_max_threads()));
    h.total_bytes = h.scratch_offset + h.scratch_stride * h.threads;
    return h;
  }

  // Validates the batch and reports its work items and merges in order: a merge right after
  // its chunks. The same walk sizes the workspace (over any shard: each item then reaches the
  // sequence's last local token, the most it can) and fills it.
  template <class OnItem, class OnMerge>
  void walk(const kvrt_attention_batch& b, const sdk::Shard& shard, OnItem&& on_item,
            OnMerge&& on_merge) const {
    const int64_t chunk =
        b.page_size == 0 ? 0 : kernels::shared::split_chunk(chunk_tokens_, b.page_size);
    const bool causal = b.causal != 0 && shard.count != 0;
    sdk::check_batch(b, shard, [&](const sdk::BatchSequence& seq) {
      const int32_t q_begin = seq.q_begin, q_len = seq.q_len, kv_len = seq.kv_len;
      for (int32_t r0 = 0; r0 < q_len; r0 += static_cast<int32_t>(kRowBlock)) {
        WorkItem item{};
        item.row_begin = q_begin + r0;
        item.rows = std::min<int32_t>(static_cast<int32_t>(kRowBlock), q_len - r0);
        item.first_pos = causal ? seq.first_pos + r0 : kv_len - 1;
        item.page_base = seq.page_begin;
        item.merge = -1;
        // The local positions its last row sees.
        const int32_t end =
            causal ? static_cast<int32_t>(shard.tokens_before(int64_t{item.first_pos} + item.rows))
                   : kv_len;
        if (static_cast<uint32_t>(item.rows) <= kSplitMaxRows && end > chunk) {
          Merge merge{item.row_begin, item.rows, 0, 0};
          for (int64_t c = 0; c < end; c += chunk) {
            item.kv_begin = static_cast<int32_t>(c);
            item.kv_end = static_cast<int32_t>(std::min<int64_t>(end, c + chunk));
            item.merge = 0;  // the caller only needs to know it is a chunk
            on_item(item);
            ++merge.num_items;
          }
          on_merge(merge);
        } else {
          item.kv_begin = 0;
          item.kv_end = end;
          on_item(item);
        }
      }
    });
  }

  std::string shape_mismatch(const kvrt_kv_layout& l) const {
    const kvrt_attention_params& p = params();
    auto differs = [](const char* field, uint64_t got, uint64_t want) {
      return std::string("layout.") + field + " is " + std::to_string(got) +
             ", this attention was created for " + std::to_string(want);
    };
    if (l.num_kv_heads != p.num_kv_heads) return differs("num_kv_heads", l.num_kv_heads, kv_heads_);
    if (l.k_head_dim != p.qk_head_dim) return differs("k_head_dim", l.k_head_dim, qk_dim_);
    if (l.v_head_dim == 0) {
      // V in the K row (MLA): its first v_width values (all of them from a 1.0 store). The
      // attention says the same width, or 0 for all of K.
      const uint32_t width = l.v_width != 0 ? l.v_width : l.k_head_dim;
      if (width != v_dim_) return differs("v_width", width, v_dim_);
    } else {
      if (l.v_head_dim != p.v_head_dim) return differs("v_head_dim", l.v_head_dim, p.v_head_dim);
      // A 1.1 layout names V's width and offset (0 from a 1.0 store: the whole V row).
      if (l.v_width != 0 && l.v_width != v_dim_) return differs("v_width", l.v_width, v_dim_);
    }
    if (l.v_offset != 0) return differs("v_offset", l.v_offset, 0);
    if (l.page_size == 0) return "layout.page_size is 0";
    return "";
  }

  // Whether run() reads the layout's bytes itself; not_native() says why not.
  static bool readable(const kvrt_kv_layout& l) {
    const bool scaled =
        l.scale_mode == KVRT_SCALE_PER_TENSOR || l.scale_mode == KVRT_SCALE_PER_TOKEN_HEAD;
    return native_dtype(l.k_dtype) && native_dtype(l.v_dtype) && l.k_base != nullptr &&
           l.v_base != nullptr && (l.scale_mode == KVRT_SCALE_NONE || scaled) &&
           (!scaled || (l.k_scale != nullptr && l.v_scale != nullptr)) && l.k_head_stride >= 0 &&
           l.v_head_stride >= 0;
  }

  static std::string not_native(const kvrt_kv_layout& l) {
    for (auto [part, dtype] : {std::pair{"K", l.k_dtype}, std::pair{"V", l.v_dtype}}) {
      if (!native_dtype(dtype)) {
        return std::string(part) + " dtype " + sdk::dtype_text(dtype) +
               " is not read natively (f32, bf16 and fp8_e4m3 are); run() will use the "
               "store's gather()";
      }
    }
    if (l.k_base == nullptr || l.v_base == nullptr) return "layout K or V base pointer is NULL";
    if (l.scale_mode != KVRT_SCALE_NONE && l.scale_mode != KVRT_SCALE_PER_TENSOR &&
        l.scale_mode != KVRT_SCALE_PER_TOKEN_HEAD) {
      return "scale mode " + std::to_string(l.scale_mode) + " is not read natively";
    }
    if (l.scale_mode != KVRT_SCALE_NONE && (l.k_scale == nullptr || l.v_scale == nullptr)) {
      return "layout has a scale mode but a NULL scale pointer";
    }
    if (l.k_head_stride < 0 || l.v_head_stride < 0) return "layout has a negative head stride";
    return "";
  }

  Layer prepare(const kvrt_attention_run_args& args, const kvrt_kv_layout& layout,
                const PlanHeader& header) const {
    auto invalid = [](const std::string& what) { sdk::fail(KVRT_ERR_INVALID_ARGUMENT, what); };
    if (header.total_rows > 0 && (args.q == nullptr || args.out == nullptr)) {
      invalid("q or out is NULL");
    }
    for (auto [name, dtype] :
         {std::pair{"q_dtype", args.q_dtype}, std::pair{"out_dtype", args.out_dtype}}) {
      if (dtype != KVRT_DTYPE_F32 && dtype != KVRT_DTYPE_BF16) {
        sdk::fail(KVRT_ERR_UNSUPPORTED, std::string(name) + " " + dtype_name(dtype) +
                                            " not supported (f32 and bf16 are)");
      }
    }
    Layer layer{};
    layer.args = &args;
    layer.layout = &layout;
    const int64_t q_row = int64_t{q_heads_} * qk_dim_, out_row = int64_t{q_heads_} * v_dim_;
    layer.q_stride = args.q_row_stride == 0 ? q_row : args.q_row_stride;
    layer.out_stride = args.out_row_stride == 0 ? out_row : args.out_row_stride;
    if (layer.q_stride < q_row || layer.out_stride < out_row) {
      invalid("q_row_stride / out_row_stride shorter than a row");
    }
    if (std::string why = shape_mismatch(layout); !why.empty()) invalid(why);
    if (layout.page_size != header.page_size) {
      invalid("layout.page_size " + std::to_string(layout.page_size) + " but the batch has " +
              std::to_string(header.page_size));
    }
    for (int64_t i = header.first_page; i < header.end_page; ++i) {
      if (static_cast<uint64_t>(header.page_indices[i]) >= layout.num_pages) {
        sdk::fail(KVRT_ERR_OUT_OF_RANGE, "page id " + std::to_string(header.page_indices[i]) +
                                             " beyond the store's " +
                                             std::to_string(layout.num_pages) + " pages");
      }
    }
    layer.native = readable(layout);  // no message built: run() allocates nothing
    if (!layer.native &&
        (args.store_api == nullptr || args.store_api->gather == nullptr || args.store == nullptr)) {
      sdk::fail(KVRT_ERR_UNSUPPORTED,
                not_native(layout) + ", but no store with a gather() was given");
    }
    layer.score_scale = params().softmax_scale;
    layer.out_scale = 1.0f;
    if (layer.native) {
      layer.k_type = kv_elem(layout.k_dtype);
      layer.v_type = kv_elem(layout.v_dtype);
      layer.token_scales = layout.scale_mode == KVRT_SCALE_PER_TOKEN_HEAD;
      if (layout.scale_mode == KVRT_SCALE_PER_TENSOR) {
        layer.score_scale *= *layout.k_scale;
        layer.out_scale = *layout.v_scale;
      }
    } else {  // gather() gives dequantized f32
      layer.k_type = layer.v_type = KvElem::kF32;
      const std::optional<kvrt_kv_format> f =
          sdk::kv_format(args.store_api, args.store, args.layer);
      layer.parallel_gather = f && (f->capabilities & KVRT_KV_GATHER_THREAD_SAFE) != 0;
    }
    layer.scratch = plan_ + header.scratch_offset;
    return layer;
  }

  template <class T>
  T* scratch(const Layer& layer, uint64_t offset) const {
    return reinterpret_cast<T*>(layer.scratch + offset);
  }

  // bf16 Q: the item's rows converted to f32 [rows][q_heads][qk_dim] in the scratch, once per
  // item. f32 Q: nullptr, the rows are read in place.
  const float* q_rows(const Layer& layer, const WorkItem& item, float* converted) const {
    const kvrt_attention_run_args& a = *layer.args;
    if (a.q_dtype == KVRT_DTYPE_F32) return nullptr;
    const size_t row = size_t{q_heads_} * qk_dim_;
    for (int32_t r = 0; r < item.rows; ++r) {
      const auto* src = static_cast<const uint16_t*>(a.q) + (item.row_begin + r) * layer.q_stride;
      kernels::bf16_to_f32(src, converted + r * row, row);
    }
    return converted;
  }

  void run_item(const Layer& layer, const PlanHeader& header, const WorkItem& item) const {
    const kvrt_attention_run_args& a = *layer.args;
    const kvrt_kv_layout& l = *layer.layout;
    uint8_t* state_base = item.merge < 0 ? layer.scratch + scratch_.state : plan_ + item.partial;
    const State st = state_at(state_base, static_cast<uint32_t>(item.rows));
    const size_t heads = size_t{static_cast<uint32_t>(item.rows)} * q_heads_;
    std::fill(st.max, st.max + heads, kNegInf);
    std::fill(st.sum, st.sum + heads, 0.0f);
    std::fill(st.acc, st.acc + heads * v_dim_, 0.0f);

    const float* converted = q_rows(layer, item, scratch<float>(layer, scratch_.q));
    const size_t q_row = size_t{q_heads_} * qk_dim_;
    auto q_of = [&](int32_t r) {
      return converted != nullptr
                 ? converted + r * q_row
                 : static_cast<const float*>(a.q) + (item.row_begin + r) * layer.q_stride;
    };
    auto* scores = scratch<float>(layer, scratch_.scores);
    auto* rescale = scratch<float>(layer, scratch_.rescale);
    auto* s_off = scratch<int64_t>(layer, scratch_.s_off);
    auto* k_rows = scratch<const void*>(layer, scratch_.k_rows);
    auto* v_rows = scratch<const void*>(layer, scratch_.v_rows);
    auto* k_ahead = scratch<const void*>(layer, scratch_.k_ahead);
    auto* k_scales = scratch<float>(layer, scratch_.k_scales);
    auto* v_scales = scratch<float>(layer, scratch_.v_scales);
    auto* slots = scratch<int64_t>(layer, scratch_.slots);
    auto* kt = scratch<float>(layer, scratch_.kt);
    auto* vt = scratch<float>(layer, scratch_.vt);
    // Many rows (prefill) share each tile, so it is decoded once per tile and head: K transposed,
    // so each row's scores are outer products with no horizontal sums, and V as f32 rows, so
    // each row's sums stay in registers over the tile. For 16 rows of synth-76m's shape, per
    // tile: scores 13.3 us against 18.7, sums 12.8 us against 22.5 (decoding included).
    const bool shared_tile = item.rows >= kSharedTileMinRows || group_ >= kSharedTileMinGroup;
    const size_t kt_head = size_t{qk_dim_} * kTile, vt_head = size_t{v_dim_} * kTile;
    auto* gathered_k = scratch<float>(layer, scratch_.gathered_k);
    // V in the K row (MLA): the V rows are the K rows, read to v_dim_.
    const bool v_in_k = l.v_head_dim == 0;
    float* gathered_v = v_in_k ? gathered_k : scratch<float>(layer, scratch_.gathered_v);
    const size_t gathered_v_row = v_in_k ? qk_dim_ : v_dim_;
    const auto* k_base = static_cast<const uint8_t*>(l.k_base);
    const auto* v_base = static_cast<const uint8_t*>(l.v_base);
    const auto* ks_base = reinterpret_cast<const uint8_t*>(l.k_scale);
    const auto* vs_base = reinterpret_cast<const uint8_t*>(l.v_scale);
    const int32_t page_size = static_cast<int32_t>(header.page_size);

    // Row pointers are each position's head 0 (the page-table arithmetic, once per position for
    // all heads); the kernels step to head h by the head stride and walk a tile token by token,
    // all heads of a token together, which is address order in a token-major page.
    const size_t k_head_stride =
        layer.native ? static_cast<size_t>(l.k_head_stride) : size_t{qk_dim_} * sizeof(float);
    const size_t v_head_stride =
        layer.native ? static_cast<size_t>(l.v_head_stride) : gathered_v_row * sizeof(float);
    // Software prefetch, because the hardware prefetchers start over at every page and a page
    // table puts pages anywhere:
    //  - prefill (shared tiles): the next tile's K and V rows, into L2, while this one computes;
    //  - decode: the first row's scores prefetch, token by token as they go, the K row
    //    kPrefetchTokens positions on (into the next tile at its end) and the token's V row,
    //    for the sums after the softmax. A whole next tile at once is as large as L1 and evicts
    //    the tile in use, and a burst of prefetches stalls once the miss buffers are full.
    // Position pos of the sequence: its page id and its offset in the page, and the K and V
    // rows (head 0) there in the store's layout.
    auto locate = [&](int32_t pos) {
      const kernels::shared::PagePosition at =
          kernels::shared::locate(header.page_indices + item.page_base, page_size, pos);
      return std::pair<int64_t, int64_t>{at.page, at.offset};
    };
    auto k_row = [&](int64_t page, int64_t offset) {
      return k_base + kernels::shared::row_offset({page, offset}, l.k_page_stride,
                                                  l.k_token_stride, 0, 0);
    };
    auto v_row = [&](int64_t page, int64_t offset) {
      return v_base + kernels::shared::row_offset({page, offset}, l.v_page_stride,
                                                  l.v_token_stride, 0, 0);
    };
    const size_t k_token_bytes = kv_heads_ * k_head_stride;
    const size_t v_token_bytes = kv_heads_ * v_head_stride;
    auto prefetch_tile = [&](int32_t begin, int32_t n) {
      for (int32_t pos = begin; pos < begin + n; ++pos) {
        const auto [page, offset] = locate(pos);
        const uint8_t* k = k_row(page, offset);
        const uint8_t* v = v_row(page, offset);
        for (size_t b = 0; b < k_token_bytes; b += 64) __builtin_prefetch(k + b, 0, 1);
        for (size_t b = 0; b < v_token_bytes; b += 64) __builtin_prefetch(v + b, 0, 1);
      }
    };
    // Decode's first row: scores of positions [t0, t0 + valid) of a tile of n, prefetching as
    // they go (the positions past the item's end prefetch its last row again). Positions still
    // in the tile take its row pointers; only those in the next tile are located here.
    auto scores_prefetching = [&](const float* q, int32_t t0, int32_t n, int32_t valid) {
      const auto ahead = static_cast<int32_t>(kPrefetchTokens);
      for (int32_t i = 0; i < valid; ++i) {
        const int32_t pos = std::min(t0 + i + ahead, item.kv_end - 1);
        if (pos < t0 + n) {
          k_ahead[i] = k_rows[pos - t0];
        } else {
          const auto [page, offset] = locate(pos);
          k_ahead[i] = k_row(page, offset);
        }
      }
      const kernels::PrefetchRows lists[] = {{k_ahead, k_token_bytes}, {v_rows, v_token_bytes}};
      kernels::qk_dots_heads(layer.k_type, q, qk_dim_, group_, kv_heads_, k_rows, k_head_stride,
                             static_cast<size_t>(valid), qk_dim_, scores, kTile, lists, 2);
    };
    const auto tile = static_cast<int32_t>(kTile);
    for (int32_t t0 = item.kv_begin; t0 < item.kv_end; t0 += tile) {
      const int32_t n = std::min(tile, item.kv_end - t0);
      if (layer.native && shared_tile && t0 + tile < item.kv_end) {
        prefetch_tile(t0 + tile, std::min(tile, item.kv_end - t0 - tile));
      }
      for (int32_t i = 0; i < n; ++i) {
        const auto [page, offset] = locate(t0 + i);
        s_off[i] = page * l.scale_page_stride + offset * l.scale_token_stride;
        slots[i] = page * page_size + offset;
        if (layer.native) {
          k_rows[i] = k_row(page, offset);
          v_rows[i] = v_row(page, offset);
        } else {
          k_rows[i] = gathered_k + size_t{static_cast<uint32_t>(i)} * kv_heads_ * qk_dim_;
          v_rows[i] = gathered_v + size_t{static_cast<uint32_t>(i)} * kv_heads_ * gathered_v_row;
        }
      }
      if (!layer.native) {
        const kvrt_status s =
            a.store_api->gather(a.store, a.layer, static_cast<uint32_t>(n), slots, gathered_k,
                                v_in_k ? nullptr : gathered_v);
        if (s != KVRT_OK) throw sdk::Forwarded(s);  // the store recorded why
      }
      if (layer.token_scales) {  // [head][position]
        for (uint32_t h = 0; h < kv_heads_; ++h) {
          for (int32_t i = 0; i < n; ++i) {
            const int64_t at = s_off[i] + h * l.scale_head_stride;
            std::memcpy(&k_scales[h * kTile + i], ks_base + at, 4);
            std::memcpy(&v_scales[h * kTile + i], vs_base + at, 4);
          }
        }
      }
      if (shared_tile) {
        for (uint32_t h = 0; h < kv_heads_; ++h) {
          kernels::transpose_rows(layer.k_type, k_rows, h * k_head_stride, static_cast<size_t>(n),
                                  qk_dim_, kt + h * kt_head, kTile);
          kernels::decode_rows(layer.v_type, v_rows, h * v_head_stride, static_cast<size_t>(n),
                               v_dim_, vt + h * vt_head, v_dim_);
        }
      }
      for (int32_t r = 0; r < item.rows; ++r) {
        // Causal rows see positions up to their limit; later rows of a block see more.
        const int32_t limit = row_limit(header, item, r);
        const int32_t valid = std::clamp(limit + 1 - t0, 0, n);
        if (valid == 0) continue;
        const size_t at = size_t{static_cast<uint32_t>(r)} * q_heads_;
        if (shared_tile) {
          for (uint32_t h = 0; h < kv_heads_; ++h) {
            const size_t q0 = size_t{h} * group_;
            kernels::qk_dots_transposed(q_of(r) + q0 * qk_dim_, qk_dim_, group_, kt + h * kt_head,
                                        kTile, static_cast<size_t>(valid), qk_dim_,
                                        scores + q0 * kTile, kTile);
          }
        } else if (layer.native && r == 0) {
          scores_prefetching(q_of(r), t0, n, valid);
        } else {
          kernels::qk_dots_heads(layer.k_type, q_of(r), qk_dim_, group_, kv_heads_, k_rows,
                                 k_head_stride, static_cast<size_t>(valid), qk_dim_, scores, kTile);
        }
        if (layer.token_scales) {  // each KV head has its own scales
          for (uint32_t h = 0; h < kv_heads_; ++h) {
            const size_t q0 = size_t{h} * group_;
            kernels::online_softmax(scores + q0 * kTile, kTile, group_, static_cast<size_t>(valid),
                                    layer.score_scale, k_scales + h * kTile, v_scales + h * kTile,
                                    st.max + at + q0, st.sum + at + q0, rescale + q0);
          }
        } else {
          kernels::online_softmax(scores, kTile, q_heads_, static_cast<size_t>(valid),
                                  layer.score_scale, nullptr, nullptr, st.max + at, st.sum + at,
                                  rescale);
        }
        if (shared_tile) {
          for (uint32_t h = 0; h < kv_heads_; ++h) {
            const size_t q0 = size_t{h} * group_;
            kernels::pv_accumulate_tile(scores + q0 * kTile, kTile, group_, vt + h * vt_head,
                                        v_dim_, static_cast<size_t>(valid), v_dim_, rescale + q0,
                                        st.acc + (at + q0) * v_dim_, v_dim_);
          }
        } else {
          kernels::pv_accumulate_heads(layer.v_type, scores, kTile, group_, kv_heads_, v_rows,
                                       v_head_stride, static_cast<size_t>(valid), v_dim_, rescale,
                                       st.acc + at * v_dim_, v_dim_);
        }
      }
    }
    if (item.merge >= 0) return;  // a chunk: its merge writes the output
    for (int32_t r = 0; r < item.rows; ++r) {
      for (uint32_t j = 0; j < q_heads_; ++j) {
        const size_t at = size_t{static_cast<uint32_t>(r)} * q_heads_ + j;
        finish_row(layer, item.row_begin + r, j, st.acc + at * v_dim_, st.max[at], st.sum[at]);
      }
    }
  }

  // The last local KV position query row r of `item` sees.
  static int32_t row_limit(const PlanHeader& header, const WorkItem& item, int32_t r) {
    if (header.causal == 0) return item.first_pos;
    if (header.shard_count <= 1) return item.first_pos + r;
    const sdk::Shard shard{header.shard_count, header.shard_index, header.shard_interleave};
    return static_cast<int32_t>(shard.tokens_before(int64_t{item.first_pos} + r + 1)) - 1;
  }

  // A row and head done: its output acc / sum (times a per-tensor V scale) and, for run_lse, its
  // log-sum-exp max + log(sum). A row that saw no token (sum 0, only in a shard) gets zeros and
  // -inf.
  void finish_row(const Layer& layer, int64_t row, uint32_t head, float* acc, float max,
                  float sum) const {
    if (sum > 0.0f) {
      write_out(layer, row, head, acc, layer.out_scale / sum);
    } else {
      std::fill(acc, acc + v_dim_, 0.0f);
      write_out(layer, row, head, acc, 1.0f);
    }
    if (layer.lse != nullptr) {
      layer.lse[row * layer.lse_stride + head] = sum > 0.0f ? max + std::log(sum) : kNegInf;
    }
  }

  // Flash-decoding merge: with chunk maxima m_c, sums s_c and outputs o_c (all unnormalised),
  // M = max m_c and w_c = exp(m_c - M), the output is sum w_c o_c / sum w_c s_c.
  void run_merge(const Layer& layer, const WorkItem* items, const Merge& merge) const {
    auto* out_row = scratch<float>(layer, scratch_.out_row);
    for (int32_t r = 0; r < merge.rows; ++r) {
      for (uint32_t j = 0; j < q_heads_; ++j) {
        const size_t at = size_t{static_cast<uint32_t>(r)} * q_heads_ + j;
        float max = kNegInf;
        for (int32_t c = 0; c < merge.num_items; ++c) {
          const WorkItem& item = items[merge.first_item + c];
          max = std::max(max, state_at(plan_ + item.partial, item.rows).max[at]);
        }
        std::fill(out_row, out_row + v_dim_, 0.0f);
        float sum = 0;  // of the chunks' sums, in units of exp(max)
        for (int32_t c = 0; c < merge.num_items; ++c) {
          const WorkItem& item = items[merge.first_item + c];
          const State st = state_at(plan_ + item.partial, item.rows);
          const float w = kernels::shared::merge_weight(st.max[at], max);
          if (w == 0.0f) continue;  // the row sees nothing of this chunk (or nothing that counts)
          sum += w * st.sum[at];
          const void* row = st.acc + at * v_dim_;
          kernels::pv_accumulate(KvElem::kF32, &w, 1, 1, &row, 1, v_dim_, nullptr, out_row, v_dim_);
        }
        finish_row(layer, merge.row_begin + r, j, out_row, max, sum);
      }
    }
  }

  void write_out(const Layer& layer, int64_t row, uint32_t head, const float* acc,
                 float factor) const {
    const kvrt_attention_run_args& a = *layer.args;
    const int64_t at = row * layer.out_stride + int64_t{head} * v_dim_;
    if (a.out_dtype == KVRT_DTYPE_F32) {
      float* out = static_cast<float*>(a.out) + at;
      for (uint32_t d = 0; d < v_dim_; ++d) out[d] = acc[d] * factor;
      return;
    }
    auto* tmp = scratch<float>(layer, scratch_.out_row);
    // acc may be tmp itself (a merge's output), so scale in place first.
    for (uint32_t d = 0; d < v_dim_; ++d) tmp[d] = acc[d] * factor;
    kernels::f32_to_bf16(tmp, static_cast<uint16_t*>(a.out) + at, v_dim_);
  }

  uint32_t q_heads_ = 0, kv_heads_ = 0, group_ = 0, qk_dim_ = 0, v_dim_ = 0;
  uint32_t chunk_tokens_ = 0;
  Scratch scratch_{};
  uint8_t* plan_ = nullptr;  // the aligned workspace of the last successful plan()
};

const kvrt_option_desc kOptions[] = {
    {sizeof(kvrt_option_desc), KVRT_OPTION_INT, "decode_chunk_tokens", "256",
     "decode rows over more KV tokens than this are split into chunks (flash-decoding)"},
};

const kvrt_plugin_desc& describe(const kvrt_host_api*) {
  static const kvrt_plugin_desc desc = {
      sizeof(kvrt_plugin_desc),
      KVRT_ABI_MAJOR,
      KVRT_ABI_MINOR,
      KVRT_PLUGIN_ATTENTION,
      "attn_cpu",
      "0.1.0",
      "CPU attention (SIMD): f32/bf16/fp8 KV natively, any store through gather()",
      &sdk::attention_table<CpuAttention>(),
      kOptions,
      1,
      kQDtypes,
      nullptr};
  return desc;
}

}  // namespace
}  // namespace kvrt::plugins

KVRT_PLUGIN_ENTRY(kvrt::plugins::describe)
