#include "sdk/conformance/attention_conformance.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>

namespace kvrt::conformance {
namespace {

using plugin::LoadedPlugin;
using plugin::status_name;
using plugin::take_last_error;

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Unwinds out of check_attention_case with its one-line answer.
struct CaseFailure {
  std::string message;
};

float bf16_value(uint16_t b) {
  const uint32_t bits = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t to_bf16(float f) {  // round to nearest even; inputs here are finite
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

void check(kvrt_status s, const std::string& what) {
  if (s != KVRT_OK) {
    const std::string message = take_last_error();
    throw CaseFailure{what + " returned " + status_name(s) +
                      (message.empty() ? "" : ": " + message)};
  }
}

struct StoreDeleter {
  const kvrt_kv_store_api* api;
  void operator()(kvrt_kv_store* s) const { api->destroy(s); }
};
struct AttentionDeleter {
  const kvrt_attention_api* api;
  void operator()(kvrt_attention* a) const { api->destroy(a); }
};
using StorePtr = std::unique_ptr<kvrt_kv_store, StoreDeleter>;
using AttentionPtr = std::unique_ptr<kvrt_attention, AttentionDeleter>;

std::string describe(const AttentionCase& c) {
  std::string seqs;
  for (const AttentionSequence& s : c.sequences) {
    seqs += (seqs.empty() ? "" : " ") + std::to_string(s.kv_len) + "/" + std::to_string(s.q_len);
  }
  return c.store + (c.force_gather ? " (gather)" : "") + ", heads " +
         std::to_string(c.num_q_heads) + "/" + std::to_string(c.num_kv_heads) + ", dims " +
         std::to_string(c.qk_head_dim) + "/" + std::to_string(c.v_head_dim) +
         (c.v_width != 0 ? " (V the first " + std::to_string(c.v_width) + " of K)" : "") +
         ", page " +
         std::to_string(c.page_size) + ", kv/q " + seqs + (c.causal ? "" : ", non-causal") +
         (c.q_dtype == KVRT_DTYPE_BF16 ? ", bf16 Q" : "") +
         (c.out_dtype == KVRT_DTYPE_BF16 ? ", bf16 out" : "") +
         (c.shards > 1 ? ", " + std::to_string(c.shards) + " shards of runs of " +
                             std::to_string(c.interleave)
                       : "") +
         (c.lse ? ", run_lse" : "");
}

// Throws CaseFailure on a mismatch or a failed call, Skip when a store is missing.
void run_case(plugin::Registry& registry, const LoadedPlugin& attention, const AttentionCase& c,
              uint32_t seed, bool* create_unsupported) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  Result<const LoadedPlugin*> loaded = registry.load_kv_store(c.store);
  if (!loaded.ok()) throw Skip("cannot load " + c.store + ": " + loaded.status().message());
  const LoadedPlugin& store_plugin = **loaded;
  const kvrt_kv_store_api& kv = store_plugin.kv;
  if (kv.gather == nullptr) throw Skip(c.store + " has no gather() to check against");
  // V's width, and its row's: the K row's when V is in it.
  const uint32_t v_dim = c.v_head_dim != 0 ? c.v_head_dim
                         : c.v_width != 0  ? c.v_width
                                           : c.qk_head_dim;
  const uint32_t v_row_dim = c.v_head_dim == 0 ? c.qk_head_dim : v_dim;
  const uint32_t ps = c.page_size;

  // Pages: each sequence's in order of position, drawn from a shuffled pool with spare pages,
  // so page ids are neither contiguous nor dense.
  std::vector<uint32_t> pages_of;
  uint64_t used_pages = 0;
  for (const AttentionSequence& s : c.sequences) {
    pages_of.push_back((s.kv_len + ps - 1) / ps);
    used_pages += pages_of.back();
  }
  const uint64_t num_pages = used_pages + 3;
  std::vector<int32_t> pool(num_pages);
  std::iota(pool.begin(), pool.end(), 0);
  if (c.shuffle_pages) std::shuffle(pool.begin(), pool.end(), rng);

  kvrt_kv_geometry g{};
  g.struct_size = sizeof(g);
  g.num_layers = c.layers;
  g.num_kv_heads = g.total_kv_heads = c.num_kv_heads;
  g.k_head_dim = c.qk_head_dim;
  g.v_head_dim = c.v_head_dim;
  g.v_width = v_dim;
  g.page_size = ps;
  g.input_dtype = KVRT_DTYPE_F32;
  g.tp_size = 1;
  g.device = {sizeof(kvrt_device), KVRT_DEVICE_CPU, 0, 0};
  const kvrt_config* store_config = plugin::as_config(
      c.store_config != nullptr ? c.store_config : registry.plugin_config(c.store));
  // One store per shard (one unsharded). Shard s keeps the runs of c.interleave positions whose
  // index is s modulo the shard count, in its own store, at the same page ids: a sequence's
  // first pages, as many as its share needs.
  const uint32_t shards = std::max(1u, c.shards), interleave = std::max(1u, c.interleave);
  const bool sharded = shards > 1, lse = sharded || c.lse;
  if (lse && (attention.attention.plan_sharded == nullptr || attention.attention.run_lse == nullptr)) {
    throw Skip("the plugin has no plan_sharded / run_lse (ABI 1.4)");
  }
  const auto shard_of = [&](uint32_t t) { return t / interleave % shards; };
  const auto local_of = [&](uint32_t t) {  // the token's index among its shard's
    return t / (interleave * shards) * interleave + t % interleave;
  };
  std::vector<StorePtr> stores;
  for (uint32_t s = 0; s < shards; ++s) {
    kvrt_kv_store* raw_store = nullptr;
    check(kv.create(store_plugin.host_api(), &g, num_pages, store_config, &raw_store),
          c.store + " create");
    stores.emplace_back(raw_store, StoreDeleter{&kv});
  }

  // The batch, CSR: the query rows, and each shard's pages.
  const auto batch_size = static_cast<uint32_t>(c.sequences.size());
  std::vector<int32_t> qo_indptr{0}, indices, kv_len;
  std::vector<std::vector<int32_t>> kv_indptr(shards, {0}), shard_indices(shards),
      last_len(shards);
  // Every sequence's tokens by position, back to back: the shard that keeps each, and its slot
  // there.
  std::vector<uint32_t> token_shard;
  std::vector<int64_t> slots;
  for (uint32_t b = 0; b < batch_size; ++b) {
    const AttentionSequence& seq = c.sequences[b];
    const size_t first_page = indices.size();
    for (uint32_t p = 0; p < pages_of[b]; ++p) indices.push_back(pool[indices.size()]);
    std::vector<uint32_t> kept(shards, 0);
    for (uint32_t t = 0; t < seq.kv_len; ++t) {
      const uint32_t j = local_of(t);
      token_shard.push_back(shard_of(t));
      slots.push_back(int64_t{indices[first_page + j / ps]} * ps + j % ps);
      ++kept[shard_of(t)];
    }
    for (uint32_t s = 0; s < shards; ++s) {
      const uint32_t pages = (kept[s] + ps - 1) / ps;
      shard_indices[s].insert(shard_indices[s].end(), indices.begin() + first_page,
                              indices.begin() + first_page + pages);
      kv_indptr[s].push_back(static_cast<int32_t>(shard_indices[s].size()));
      last_len[s].push_back(kept[s] == 0 ? 0 : static_cast<int32_t>((kept[s] - 1) % ps + 1));
    }
    qo_indptr.push_back(qo_indptr.back() + static_cast<int32_t>(seq.q_len));
    kv_len.push_back(static_cast<int32_t>(seq.kv_len));
  }
  const size_t total_rows = static_cast<size_t>(qo_indptr.back());

  // K/V per layer: unit normals scaled per token by 2^-2 .. 2^2, so per-token scales matter;
  // the reference reads back what the store holds.
  const size_t k_row = size_t{c.num_kv_heads} * c.qk_head_dim;
  const size_t v_row = size_t{c.num_kv_heads} * c.v_head_dim;
  std::vector<std::vector<float>> ref_k(c.layers), ref_v(c.layers);
  for (uint32_t layer = 0; layer < c.layers; ++layer) {
    std::vector<float> k(slots.size() * k_row), v(slots.size() * v_row);
    for (size_t i = 0; i < slots.size(); ++i) {
      const float magnitude = std::ldexp(1.0f, static_cast<int>(rng() % 5) - 2);
      for (size_t j = 0; j < k_row; ++j) k[i * k_row + j] = normal(rng) * magnitude;
      for (size_t j = 0; j < v_row; ++j) v[i * v_row + j] = normal(rng) * magnitude;
    }
    ref_k[layer].assign(k.size(), NAN);
    ref_v[layer].assign(v.size(), NAN);
    for (uint32_t s = 0; s < shards; ++s) {
      // The shard's tokens, written to its store and read back to where they are in the whole.
      std::vector<size_t> mine;
      for (size_t i = 0; i < slots.size(); ++i) {
        if (token_shard[i] == s) mine.push_back(i);
      }
      std::vector<int64_t> shard_slots;
      std::vector<float> sk(mine.size() * k_row), sv(mine.size() * v_row);
      for (size_t i = 0; i < mine.size(); ++i) {
        shard_slots.push_back(slots[mine[i]]);
        std::copy_n(k.begin() + static_cast<ptrdiff_t>(mine[i] * k_row), k_row,
                    sk.begin() + static_cast<ptrdiff_t>(i * k_row));
        std::copy_n(v.begin() + static_cast<ptrdiff_t>(mine[i] * v_row), v_row,
                    sv.begin() + static_cast<ptrdiff_t>(i * v_row));
      }
      if (mine.empty()) continue;
      kvrt_kv_write w{};
      w.struct_size = sizeof(w);
      w.layer = layer;
      w.dtype = KVRT_DTYPE_F32;
      w.num_tokens = static_cast<uint32_t>(mine.size());
      w.slots = shard_slots.data();
      w.k = sk.data();
      w.v = c.v_head_dim != 0 ? sv.data() : nullptr;
      check(kv.write(stores[s].get(), &w), c.store + " write");
      check(kv.gather(stores[s].get(), layer, w.num_tokens, shard_slots.data(), sk.data(),
                      c.v_head_dim != 0 ? sv.data() : nullptr),
            c.store + " gather");
      for (size_t i = 0; i < mine.size(); ++i) {
        std::copy_n(sk.begin() + static_cast<ptrdiff_t>(i * k_row), k_row,
                    ref_k[layer].begin() + static_cast<ptrdiff_t>(mine[i] * k_row));
        std::copy_n(sv.begin() + static_cast<ptrdiff_t>(i * v_row), v_row,
                    ref_v[layer].begin() + static_cast<ptrdiff_t>(mine[i] * v_row));
      }
    }
    if (c.v_head_dim == 0) ref_v[layer] = ref_k[layer];
  }

  // Q, padded rows; the reference uses what the plugin is given.
  const size_t q_row = size_t{c.num_q_heads} * c.qk_head_dim;
  const size_t out_row = size_t{c.num_q_heads} * v_dim;
  const size_t q_stride = q_row + c.row_padding, out_stride = out_row + c.row_padding;
  std::vector<float> q(total_rows * q_stride, 0.0f);
  std::vector<uint16_t> q16(q.size(), 0);
  for (size_t r = 0; r < total_rows; ++r) {
    for (size_t j = 0; j < q_row; ++j) {
      float x = normal(rng) * c.q_scale;
      if (c.q_dtype == KVRT_DTYPE_BF16) {
        q16[r * q_stride + j] = to_bf16(x);
        x = bf16_value(q16[r * q_stride + j]);
      }
      q[r * q_stride + j] = x;
    }
  }

  // The plugin.
  const kvrt_attention_api& api = attention.attention;
  kvrt_attention_params params{};
  params.struct_size = sizeof(params);
  params.num_q_heads = c.num_q_heads;
  params.num_kv_heads = c.num_kv_heads;
  params.qk_head_dim = c.qk_head_dim;
  params.v_head_dim = c.v_head_dim != 0 ? c.v_head_dim : c.v_width;
  params.softmax_scale = 1.0f / std::sqrt(static_cast<float>(c.qk_head_dim));
  params.device = {sizeof(kvrt_device), KVRT_DEVICE_CPU, 0, 0};
  const kvrt_config* attention_config = plugin::as_config(
      c.attention_config != nullptr ? c.attention_config : registry.plugin_config(attention.name));
  kvrt_attention* raw = nullptr;
  const kvrt_status created = api.create(attention.host_api(), &params, attention_config, &raw);
  if (created == KVRT_ERR_UNSUPPORTED && create_unsupported != nullptr) {
    take_last_error();
    *create_unsupported = true;
    return;
  }
  check(created, "create");
  // One handle per shard, as on the ranks of a context-parallel group.
  std::vector<AttentionPtr> attns;
  attns.emplace_back(raw, AttentionDeleter{&api});
  for (uint32_t s = 1; s < shards; ++s) {
    check(api.create(attention.host_api(), &params, attention_config, &raw), "create");
    attns.emplace_back(raw, AttentionDeleter{&api});
  }

  std::vector<kvrt_attention_batch> batches(shards);
  std::vector<std::vector<uint8_t>> workspaces(shards);
  for (uint32_t s = 0; s < shards; ++s) {
    kvrt_attention_batch& batch = batches[s];
    batch.struct_size = sizeof(batch);
    batch.batch_size = batch_size;
    batch.page_size = ps;
    batch.causal = c.causal ? 1 : 0;
    batch.qo_indptr = qo_indptr.data();
    batch.kv_page_indptr = kv_indptr[s].data();
    batch.kv_page_indices = shard_indices[s].data();
    batch.kv_last_page_len = last_len[s].data();
    uint64_t ws_bytes = 0;
    check(api.workspace_size(attns[s].get(), &batch, &ws_bytes), "workspace_size");
    // Offset by 8 bytes: the caller's workspace need not be more aligned than malloc's.
    workspaces[s].resize(ws_bytes + 8);
    if (sharded) {
      const kvrt_attention_shard shard{sizeof(kvrt_attention_shard), shards, s, interleave,
                                       kv_len.data()};
      check(api.plan_sharded(attns[s].get(), &batch, &shard, workspaces[s].data() + 8, ws_bytes),
            "plan_sharded (shard " + std::to_string(s) + ")");
    } else {
      check(api.plan(attns[s].get(), &batch, workspaces[s].data() + 8, ws_bytes), "plan");
    }
  }

  const float sentinel = 1536.0f;  // exact in bf16 too
  for (uint32_t layer = 0; layer < c.layers; ++layer) {
   // Each shard's output and log-sum-exps, merged (in double) into `out` and `got_lse`.
   std::vector<float> out(total_rows * out_stride, sentinel);
   std::vector<double> got_lse(total_rows * c.num_q_heads, -INFINITY);
   std::vector<double> merged(total_rows * out_row, 0.0);
   for (uint32_t shard = 0; shard < shards; ++shard) {
    const kvrt_kv_store* store = stores[shard].get();
    kvrt_attention* attn = attns[shard].get();
    kvrt_kv_layout layout{};
    layout.struct_size = sizeof(layout);
    check(kv.layout(store, layer, &layout), c.store + " layout");
    if (c.force_gather) {
      layout.k_dtype = layout.v_dtype = KVRT_DTYPE_INT8;
      layout.scale_mode = KVRT_SCALE_PER_TOKEN_HEAD;
      layout.k_base = layout.v_base = nullptr;
      layout.k_scale = layout.v_scale = nullptr;
      take_last_error();
      const kvrt_status s = api.supports(attn, &layout);
      const std::string why = take_last_error();
      if (s != KVRT_ERR_UNSUPPORTED || why.empty()) {
        throw CaseFailure{"supports() of an INT8 layout with NULL pointers returned " +
                          std::string(status_name(s)) +
                          (why.empty() ? " without a reason (set_error)" : "")};
      }
    }
    std::vector<float> part(total_rows * out_stride, sentinel);
    std::vector<uint16_t> out16(part.size(), to_bf16(sentinel));
    std::vector<float> part_lse(total_rows * c.num_q_heads, NAN);
    kvrt_attention_run_args args{};
    args.struct_size = sizeof(args);
    args.layer = layer;
    args.q_dtype = c.q_dtype;
    args.out_dtype = c.out_dtype;
    args.layout = &layout;
    args.store_api = &kv;
    args.store = store;
    args.q = c.q_dtype == KVRT_DTYPE_BF16 ? static_cast<const void*>(q16.data()) : q.data();
    args.out = c.out_dtype == KVRT_DTYPE_BF16 ? static_cast<void*>(out16.data()) : part.data();
    args.q_row_stride = static_cast<int64_t>(q_stride);
    args.out_row_stride = static_cast<int64_t>(out_stride);
    const std::string call = "(layer " + std::to_string(layer) +
                             (sharded ? ", shard " + std::to_string(shard) : "") + ")";
    if (lse) {
      check(api.run_lse(attn, &args, part_lse.data(), 0), "run_lse " + call);
    } else {
      check(api.run(attn, &args), "run " + call);
    }
    if (c.out_dtype == KVRT_DTYPE_BF16) {
      for (size_t i = 0; i < part.size(); ++i) part[i] = bf16_value(out16[i]);
    }
    for (size_t r = 0; r < total_rows; ++r) {
      for (size_t i = out_row; i < out_stride; ++i) {
        if (part[r * out_stride + i] != sentinel) {
          throw CaseFailure{"run wrote into the padding between output rows (row " +
                            std::to_string(r) + ")"};
        }
      }
    }
    if (!lse) {
      out = part;
      continue;
    }
    // Merged as the core merges a context-parallel group's: with L = log sum_s exp(lse_s),
    // out = sum_s exp(lse_s - L) out_s, one shard at a time (a running L).
    for (size_t r = 0; r < total_rows; ++r) {
      for (uint32_t h = 0; h < c.num_q_heads; ++h) {
        const double mine = part_lse[r * c.num_q_heads + h];
        double& total = got_lse[r * c.num_q_heads + h];
        if (std::isnan(mine)) {
          throw CaseFailure{"run_lse left the log-sum-exp of row " + std::to_string(r) +
                            ", head " + std::to_string(h) + " unwritten " + call};
        }
        if (mine == -INFINITY) {
          for (uint32_t d = 0; d < v_dim; ++d) {
            if (part[r * out_stride + size_t{h} * v_dim + d] != 0.0f) {
              throw CaseFailure{"a row that sees no token here (log-sum-exp -inf) has a nonzero "
                                "output: row " + std::to_string(r) + ", head " +
                                std::to_string(h) + " " + call};
            }
          }
          continue;
        }
        const double next = total == -INFINITY ? mine
                                               : std::max(total, mine) +
                                                     std::log1p(std::exp(-std::fabs(total - mine)));
        const double keep = total == -INFINITY ? 0.0 : std::exp(total - next);
        const double add = std::exp(mine - next);
        double* m = merged.data() + r * out_row + size_t{h} * v_dim;
        for (uint32_t d = 0; d < v_dim; ++d) {
          m[d] = m[d] * keep + add * part[r * out_stride + size_t{h} * v_dim + d];
          out[r * out_stride + size_t{h} * v_dim + d] = static_cast<float>(m[d]);
        }
        total = next;
      }
    }
   }

    // The naive reference, row by row, in double (raw pointers: this runs in sanitizer builds
    // too).
    const float* K = ref_k[layer].data();
    const float* V = ref_v[layer].data();
    const uint32_t group = c.num_q_heads / c.num_kv_heads;
    const double scale = params.softmax_scale;
    std::vector<double> p, want(v_dim);
    size_t slot_base = 0;  // the sequence's first entry in `slots`
    for (uint32_t b = 0; b < batch_size; ++b) {
      const AttentionSequence& s = c.sequences[b];
      for (uint32_t j = 0; j < s.q_len; ++j) {
        const size_t row = static_cast<size_t>(qo_indptr[b]) + j;
        const uint32_t limit = c.causal ? s.kv_len - s.q_len + j : s.kv_len - 1;
        for (uint32_t h = 0; h < c.num_q_heads; ++h) {
          const uint32_t kvh = h / group;
          const float* qh = q.data() + row * q_stride + size_t{h} * c.qk_head_dim;
          p.assign(limit + 1, 0.0);
          double max = -INFINITY, sum = 0, v_max = 0;
          for (uint32_t t = 0; t <= limit; ++t) {
            const float* k = K + ((slot_base + t) * c.num_kv_heads + kvh) * c.qk_head_dim;
            double dot = 0;
            for (uint32_t d = 0; d < c.qk_head_dim; ++d) dot += double{qh[d]} * k[d];
            p[t] = dot * scale;
            max = std::max(max, p[t]);
          }
          for (double& x : p) sum += (x = std::exp(x - max));
          std::fill(want.begin(), want.end(), 0.0);
          double* w = want.data();
          for (uint32_t t = 0; t <= limit; ++t) {
            const float* v = V + ((slot_base + t) * c.num_kv_heads + kvh) * v_row_dim;
            const double weight = p[t] / sum;
            for (uint32_t d = 0; d < v_dim; ++d) {
              w[d] += weight * v[d];
              v_max = std::max(v_max, double{std::fabs(v[d])});
            }
          }
          // The output is a convex combination of the V rows: its scale is max |V|.
          const double bound = 1e-4 * v_max + 1e-30;
          for (uint32_t d = 0; d < v_dim; ++d) {
            const double got = out[row * out_stride + size_t{h} * v_dim + d];
            const double allowed =
                bound + (c.out_dtype == KVRT_DTYPE_BF16 ? std::ldexp(std::fabs(want[d]), -8) : 0);
            if (!(std::fabs(got - want[d]) <= allowed)) {
              throw CaseFailure{
                  "layer " + std::to_string(layer) + ", sequence " + std::to_string(b) + " (kv " +
                  std::to_string(s.kv_len) + ", q " + std::to_string(s.q_len) + "), row " +
                  std::to_string(j) + ", head " + std::to_string(h) + ", element " +
                  std::to_string(d) + ": got " + std::to_string(got) + ", want " +
                  std::to_string(want[d]) + " (error " + std::to_string(std::fabs(got - want[d])) +
                  " > " + std::to_string(allowed) + ")"};
            }
          }
          // run_lse's log-sum-exp (merged over the shards): log sum_t exp(score_t).
          if (lse) {
            const double want_lse = max + std::log(sum);
            const double got = got_lse[row * c.num_q_heads + h];
            if (!(std::fabs(got - want_lse) <= 1e-4 * std::max(1.0, std::fabs(want_lse)))) {
              throw CaseFailure{"layer " + std::to_string(layer) + ", sequence " +
                                std::to_string(b) + ", row " + std::to_string(j) + ", head " +
                                std::to_string(h) + ": log-sum-exp " + std::to_string(got) +
                                ", want " + std::to_string(want_lse)};
            }
          }
        }
      }
      slot_base += s.kv_len;
    }
  }
}

// ---- the suite ----------------------------------------------------------------------------

class Suite {
 public:
  Suite(plugin::Registry& registry, const LoadedPlugin& p, const Options& options)
      : registry_(registry),
        plugin_(p),
        api_(p.attention),
        host_(p.host_api()),
        config_(plugin::as_config(registry.plugin_config(p.name))),
        seed_(options.seed) {
    per_tensor_.insert("scale_mode", "per_tensor");
    per_tensor_.insert("k_scale", 0.05);
    per_tensor_.insert("v_scale", 0.03);
  }

  void reference_kv_bf16_paged() { store_shapes("kv_bf16_paged", nullptr); }
  void reference_kv_fp8_e4m3_per_token_head() {
    per_token_head_.insert("scale_mode", "per_token_head");
    store_shapes("kv_fp8_e4m3", &per_token_head_);
  }
  void reference_kv_fp8_e4m3_per_tensor() { store_shapes("kv_fp8_e4m3", &per_tensor_); }

  void decode_many_pages() {
    // Long decodes over hundreds of scattered pages, beside short ones, in one batch: the
    // case flash-decoding style plugins split over chunks.
    AttentionCase c;
    c.num_q_heads = 8;
    c.num_kv_heads = 2;
    c.qk_head_dim = c.v_head_dim = 64;
    c.sequences = {{3000, 1}, {1, 1}, {777, 1}, {4099, 1}};
    expect(c);
    c.page_size = 1;
    c.sequences = {{1500, 1}, {2, 1}};
    expect(c);
  }

  void causal_prefill() {
    AttentionCase c;
    for (uint32_t page_size : {1u, 16u}) {
      c.page_size = page_size;
      c.sequences = {{50, 50}};  // a whole prompt
      expect(c);
      c.sequences = {{300, 40}};  // a chunk after earlier context
      expect(c);
      c.sequences = {{33, 33}, {100, 17}};
      expect(c);
    }
    c.causal = false;  // and the non-causal form: every row sees every position
    c.sequences = {{40, 7}};
    expect(c);
  }

  void gqa() {
    AttentionCase c;
    c.sequences = {{70, 1}, {45, 9}};
    for (uint32_t group : {1u, 2u, 4u, 8u}) {
      c.num_kv_heads = 2;
      c.num_q_heads = 2 * group;
      expect(c);
    }
    c.num_kv_heads = 1;  // MQA
    c.num_q_heads = 7;
    expect(c);
  }

  void mixed_batch() {
    AttentionCase c;
    c.sequences = {{500, 1}, {64, 64}, {2, 1}, {200, 31}, {17, 1}, {300, 5}};
    expect(c);
  }

  void q_and_out_dtypes() {
    AttentionCase c;
    c.sequences = {{90, 1}, {40, 12}};
    c.row_padding = 8;
    for (kvrt_dtype q : {KVRT_DTYPE_F32, KVRT_DTYPE_BF16}) {
      if ((plugin_.desc.input_dtypes & KVRT_DTYPE_BIT(q)) == 0) continue;
      for (kvrt_dtype out : {KVRT_DTYPE_F32, KVRT_DTYPE_BF16}) {
        c.q_dtype = q;
        c.out_dtype = out;
        expect(c);
      }
    }
  }

  void gather_fallback() {
    AttentionCase c;
    c.force_gather = true;
    c.sequences = {{600, 1}, {70, 20}};
    expect(c);
    c.store = "kv_fp8_e4m3";
    expect(c);
  }

  void one_plan_many_layers() {
    AttentionCase c;
    c.layers = 3;
    c.sequences = {{400, 1}, {30, 10}};
    expect(c);
  }

  void mla_v_is_k() {
    AttentionCase c;
    c.num_q_heads = 8;
    c.num_kv_heads = 1;
    c.qk_head_dim = 96;
    c.v_head_dim = 0;
    c.sequences = {{300, 1}, {20, 6}};
    bool unsupported = false;
    expect(c, &unsupported);
    if (unsupported) throw NotApplicable("the plugin does not serve v_head_dim 0 (V is K)");
    // MLA's latent (DeepSeek-V3 / Kimi-K2: 512 + 64; V its first 512 values), decode and a
    // prefill chunk after earlier context, across page boundaries.
    c.num_q_heads = 16;
    c.qk_head_dim = 576;
    c.v_width = 512;
    c.page_size = 64;
    c.sequences = {{1, 1}, {129, 1}, {70, 6}};
    expect(c, &unsupported);
    if (unsupported) {
      throw NotApplicable("the plugin does not serve an MLA latent (V the first 512 of 576)");
    }
  }

  // ABI 1.4: run_lse's log-sum-exps against the reference's, unsharded.
  void log_sum_exp() {
    require_context_parallel();
    AttentionCase c;
    c.lse = true;
    c.sequences = {{300, 1}, {1, 1}, {40, 12}, {3000, 1}};  // 3000: split by plugins that split
    expect(c);
    c.store = "kv_fp8_e4m3";
    c.store_config = &per_tensor_;  // a K scale folded into the scores
    expect(c);
    c.store_config = &per_token_head_;
    per_token_head_.insert_or_assign("scale_mode", "per_token_head");
    expect(c);
  }

  // ABI 1.4: a sequence's tokens dealt out over N shards (single tokens, and runs of a page),
  // each attended by its own handle over its own store with plan_sharded + run_lse, then merged
  // by their log-sum-exps: the attention over the whole, with rows that see nothing on a shard
  // (short sequences), prefill chunks, long decodes, GQA and MLA's latent.
  void context_parallel() {
    require_context_parallel();
    AttentionCase c;
    c.sequences = {{1, 1}, {2, 1}, {5, 5}, {37, 1}, {300, 1}, {70, 24}, {1200, 1}};
    for (uint32_t shards : {2u, 3u, 4u, 8u}) {
      for (uint32_t page_size : {1u, 16u}) {
        for (uint32_t interleave : {1u, page_size}) {
          c.shards = shards;
          c.page_size = page_size;
          c.interleave = interleave;
          expect(c);
        }
      }
    }
    c.page_size = 16;
    c.interleave = 1;
    c.shards = 2;
    per_token_head_.insert_or_assign("scale_mode", "per_token_head");
    for (const toml::table* config : {&per_token_head_, &per_tensor_}) {
      c.store = "kv_fp8_e4m3";
      c.store_config = config;
      expect(c);
    }
    c.store = "kv_bf16_paged";
    c.store_config = nullptr;
    c.causal = false;
    expect(c);
    c.causal = true;
    // MLA: one latent, V its first 512 of 576.
    c.num_q_heads = 16;
    c.num_kv_heads = 1;
    c.qk_head_dim = 576;
    c.v_head_dim = 0;
    c.v_width = 512;
    c.sequences = {{1, 1}, {129, 1}, {70, 6}};
    for (uint32_t shards : {2u, 4u}) {
      c.shards = shards;
      bool unsupported = false;
      expect(c, &unsupported);
      if (unsupported) return;  // mla_v_is_k says so
    }
  }

  void bad_arguments();

 private:
  void require_context_parallel() const {
    if (api_.plan_sharded == nullptr || api_.run_lse == nullptr) {
      throw NotApplicable(
          "no plan_sharded / run_lse (ABI 1.4): the plugin cannot serve tp.dcp_size > 1");
    }
  }

  void expect(const AttentionCase& c, bool* create_unsupported = nullptr) {
    try {
      run_case(registry_, plugin_, c, seed_++, create_unsupported);
    } catch (const CaseFailure& f) {
      throw Failure(describe(c) + ": " + f.message);
    }
  }

  void store_shapes(const std::string& store, const toml::table* config) {
    AttentionCase c;
    c.store = store;
    c.store_config = config;
    struct Shape {
      uint32_t q_heads, kv_heads, dim, page_size;
    };
    for (Shape s : {Shape{4, 4, 16, 16}, Shape{8, 2, 64, 16}, Shape{16, 4, 128, 32},
                    Shape{4, 1, 256, 8}, Shape{2, 2, 8, 3}}) {
      c.num_q_heads = s.q_heads;
      c.num_kv_heads = s.kv_heads;
      c.qk_head_dim = c.v_head_dim = s.dim;
      c.page_size = s.page_size;
      // Page boundaries, a long decode (split by plugins that split) and a prefill chunk.
      c.sequences = {{1, 1}, {s.page_size, 1}, {s.page_size + 1, 1}, {700, 1}, {60, 12}};
      c.q_scale = s.dim >= 128 ? 2.0f : 1.0f;  // sharper softmax too
      expect(c);
    }
  }

  plugin::Registry& registry_;
  const LoadedPlugin& plugin_;
  const kvrt_attention_api& api_;
  const kvrt_host_api* host_;
  const kvrt_config* config_;
  uint32_t seed_;
  toml::table per_tensor_, per_token_head_;
};

void Suite::bad_arguments() {
  auto expect_status = [&](auto&& call, std::initializer_list<kvrt_status> allowed,
                           const std::string& name) {
    take_last_error();
    const kvrt_status got = call();
    const std::string message = take_last_error();
    if (std::find(allowed.begin(), allowed.end(), got) == allowed.end()) {
      std::string want;
      for (kvrt_status s : allowed)
        want += (want.empty() ? "" : " or ") + std::string(status_name(s));
      throw Failure(name + " returned " + status_name(got) + ", expected " + want);
    }
    if (got != KVRT_ERR_INVALID_ARGUMENT && message.empty()) {
      throw Failure(name + " returned " + status_name(got) + " without a message (set_error)");
    }
  };
  kvrt_attention_params p{};
  p.struct_size = sizeof(p);
  p.num_q_heads = 4;
  p.num_kv_heads = 2;
  p.qk_head_dim = p.v_head_dim = 64;
  p.softmax_scale = 0.125f;
  p.device = {sizeof(kvrt_device), KVRT_DEVICE_CPU, 0, 0};
  kvrt_attention* never = nullptr;
  expect_status([&] { return api_.create(host_, nullptr, config_, &never); },
                {KVRT_ERR_INVALID_ARGUMENT}, "create(params = NULL)");
  expect_status([&] { return api_.create(host_, &p, config_, nullptr); },
                {KVRT_ERR_INVALID_ARGUMENT}, "create(out = NULL)");
  kvrt_attention_params no_kv_heads = p, uneven = p;
  no_kv_heads.num_kv_heads = 0;
  uneven.num_q_heads = 6;  // not a multiple of 4 KV heads
  uneven.num_kv_heads = 4;
  expect_status([&] { return api_.create(host_, &no_kv_heads, config_, &never); },
                {KVRT_ERR_INVALID_ARGUMENT, KVRT_ERR_UNSUPPORTED}, "create with 0 KV heads");
  expect_status([&] { return api_.create(host_, &uneven, config_, &never); },
                {KVRT_ERR_INVALID_ARGUMENT, KVRT_ERR_UNSUPPORTED},
                "create with 6 query heads over 4 KV heads");
  {
    // No plugin serves a head of 16M elements; the refusal must say so as UNSUPPORTED.
    kvrt_attention_params bad = p;
    bad.qk_head_dim = bad.v_head_dim = 1u << 24;
    expect_status([&] { return api_.create(host_, &bad, config_, &never); }, {KVRT_ERR_UNSUPPORTED},
                  "create with head dims 2^24");
  }
  if (never != nullptr) throw Failure("a create that failed returned a handle");
  api_.destroy(nullptr);  // a no-op

  kvrt_attention* raw = nullptr;
  if (api_.create(host_, &p, config_, &raw) != KVRT_OK) {
    throw Failure("create of 4 q heads / 2 KV heads / dim 64 failed: " + take_last_error());
  }
  AttentionPtr attn(raw, AttentionDeleter{&api_});
  const int32_t qo[] = {0, 1}, kv_indptr[] = {0, 1}, pages[] = {0}, last[] = {4};
  kvrt_attention_batch batch{};
  batch.struct_size = sizeof(batch);
  batch.batch_size = 1;
  batch.page_size = 4;
  batch.causal = 1;
  batch.qo_indptr = qo;
  batch.kv_page_indptr = kv_indptr;
  batch.kv_page_indices = pages;
  batch.kv_last_page_len = last;
  uint64_t bytes = 0;
  expect_status([&] { return api_.supports(attn.get(), nullptr); }, {KVRT_ERR_INVALID_ARGUMENT},
                "supports(layout = NULL)");
  expect_status([&] { return api_.workspace_size(attn.get(), nullptr, &bytes); },
                {KVRT_ERR_INVALID_ARGUMENT}, "workspace_size(batch = NULL)");
  expect_status([&] { return api_.workspace_size(attn.get(), &batch, nullptr); },
                {KVRT_ERR_INVALID_ARGUMENT}, "workspace_size(out = NULL)");
  if (api_.workspace_size(attn.get(), &batch, &bytes) != KVRT_OK) {
    throw Failure("workspace_size of a one-token batch failed: " + take_last_error());
  }
  std::vector<uint8_t> workspace(bytes + 1);
  expect_status([&] { return api_.plan(attn.get(), nullptr, workspace.data(), bytes); },
                {KVRT_ERR_INVALID_ARGUMENT}, "plan(batch = NULL)");
  if (bytes > 0) {
    expect_status([&] { return api_.plan(attn.get(), &batch, nullptr, bytes); },
                  {KVRT_ERR_INVALID_ARGUMENT}, "plan(workspace = NULL)");
    expect_status([&] { return api_.plan(attn.get(), &batch, workspace.data(), bytes - 1); },
                  {KVRT_ERR_INVALID_ARGUMENT}, "plan with a workspace 1 byte short");
  }
  {
    const int32_t bad_last[] = {5};  // more than page_size
    kvrt_attention_batch bad = batch;
    bad.kv_last_page_len = bad_last;
    expect_status([&] { return api_.plan(attn.get(), &bad, workspace.data(), bytes); },
                  {KVRT_ERR_INVALID_ARGUMENT}, "plan with kv_last_page_len > page_size");
    const int32_t bad_qo[] = {1, 0};
    bad = batch;
    bad.qo_indptr = bad_qo;
    expect_status([&] { return api_.plan(attn.get(), &bad, workspace.data(), bytes); },
                  {KVRT_ERR_INVALID_ARGUMENT}, "plan with a decreasing qo_indptr");
  }
  if (api_.plan(attn.get(), &batch, workspace.data(), bytes) != KVRT_OK) {
    throw Failure("plan of a one-token batch failed: " + take_last_error());
  }
  // A real layout to run against.
  Result<const LoadedPlugin*> store_plugin = registry_.load_kv_store("kv_bf16_paged");
  if (!store_plugin.ok()) throw Skip("cannot load kv_bf16_paged for run()");
  const kvrt_kv_store_api& kv = (*store_plugin)->kv;
  kvrt_kv_geometry g{};
  g.struct_size = sizeof(g);
  g.num_layers = 1;
  g.num_kv_heads = g.total_kv_heads = 2;
  g.k_head_dim = g.v_head_dim = 64;
  g.page_size = 4;
  g.input_dtype = KVRT_DTYPE_F32;
  g.tp_size = 1;
  g.device = {sizeof(kvrt_device), KVRT_DEVICE_CPU, 0, 0};
  kvrt_kv_store* raw_store = nullptr;
  if (kv.create((*store_plugin)->host_api(), &g, 1, nullptr, &raw_store) != KVRT_OK) {
    throw Failure("kv_bf16_paged create failed: " + take_last_error());
  }
  StorePtr store(raw_store, StoreDeleter{&kv});
  kvrt_kv_layout layout{};
  layout.struct_size = sizeof(layout);
  if (kv.layout(store.get(), 0, &layout) != KVRT_OK) throw Failure("layout failed");
  std::vector<float> q(4 * 64, 0.5f), out(4 * 64);
  kvrt_attention_run_args args{};
  args.struct_size = sizeof(args);
  args.q_dtype = args.out_dtype = KVRT_DTYPE_F32;
  args.layout = &layout;
  args.store_api = &kv;
  args.store = store.get();
  args.q = q.data();
  args.out = out.data();
  expect_status([&] { return api_.run(attn.get(), nullptr); }, {KVRT_ERR_INVALID_ARGUMENT},
                "run(args = NULL)");
  for (int which = 0; which < 3; ++which) {
    kvrt_attention_run_args bad = args;
    const char* name = which == 0   ? "run with q = NULL"
                       : which == 1 ? "run with out = NULL"
                                    : "run with layout = NULL";
    if (which == 0) bad.q = nullptr;
    if (which == 1) bad.out = nullptr;
    if (which == 2) bad.layout = nullptr;
    expect_status([&] { return api_.run(attn.get(), &bad); }, {KVRT_ERR_INVALID_ARGUMENT}, name);
  }
  // A page id beyond the store: refused, not read.
  const int32_t far_page[] = {1};
  kvrt_attention_batch far = batch;
  far.kv_page_indices = far_page;
  if (api_.plan(attn.get(), &far, workspace.data(), bytes) == KVRT_OK) {
    expect_status([&] { return api_.run(attn.get(), &args); },
                  {KVRT_ERR_OUT_OF_RANGE, KVRT_ERR_INVALID_ARGUMENT},
                  "run over page 1 of a 1-page store");
  } else {
    take_last_error();
  }
  // After all that, a good call still works.
  if (api_.plan(attn.get(), &batch, workspace.data(), bytes) != KVRT_OK ||
      api_.run(attn.get(), &args) != KVRT_OK) {
    throw Failure("a valid plan + run failed after the bad calls: " + take_last_error());
  }
}

struct Property {
  const char* name;
  void (Suite::*run)();
};

const std::vector<Property>& properties() {
  static const std::vector<Property> all = {
      {"reference_kv_bf16_paged", &Suite::reference_kv_bf16_paged},
      {"reference_kv_fp8_e4m3_per_token_head", &Suite::reference_kv_fp8_e4m3_per_token_head},
      {"reference_kv_fp8_e4m3_per_tensor", &Suite::reference_kv_fp8_e4m3_per_tensor},
      {"decode_many_pages", &Suite::decode_many_pages},
      {"causal_prefill", &Suite::causal_prefill},
      {"gqa", &Suite::gqa},
      {"mixed_batch", &Suite::mixed_batch},
      {"q_and_out_dtypes", &Suite::q_and_out_dtypes},
      {"gather_fallback", &Suite::gather_fallback},
      {"one_plan_many_layers", &Suite::one_plan_many_layers},
      {"mla_v_is_k", &Suite::mla_v_is_k},
      {"log_sum_exp", &Suite::log_sum_exp},
      {"context_parallel", &Suite::context_parallel},
      {"bad_arguments", &Suite::bad_arguments},
  };
  return all;
}

}  // namespace

std::string check_attention_case(plugin::Registry& registry, const LoadedPlugin& attention,
                                 const AttentionCase& c, uint32_t seed, bool* create_unsupported) {
  try {
    run_case(registry, attention, c, seed, create_unsupported);
    return "";
  } catch (const CaseFailure& f) {
    return describe(c) + ": " + f.message;
  } catch (const std::exception& e) {
    return describe(c) + ": " + e.what();
  }
}

std::vector<PropertyResult> run_attention_suite(plugin::Registry& registry,
                                                const LoadedPlugin& plugin, const Options& options,
                                                std::ostream& log) {
  std::vector<PropertyResult> results;
  for (const Property& p : properties()) {
    Suite suite(registry, plugin, options);
    auto body = [&] {
      try {
        (suite.*p.run)();
      } catch (const CaseFailure& e) {
        throw Failure(e.message);
      }
    };
    results.push_back(run_property(plugin.name, p.name, body, log));
  }
  return results;
}

}  // namespace kvrt::conformance
