#include "core/exec/shard.h"

#include <string>

namespace kvrt::exec {

Range split(int64_t total, int parts, int index) {
  const int64_t base = total / parts, extra = total % parts;
  const int64_t begin = index * base + std::min<int64_t>(index, extra);
  return {begin, begin + base + (index < extra ? 1 : 0)};
}

Result<RankShard> shard_for(int64_t num_heads, int64_t num_kv_heads, int64_t intermediate,
                            int64_t vocab, int rank, int tp) {
  if (tp < 1 || rank < 0 || rank >= tp) return Status::InvalidArgument("bad TP rank");
  if (num_kv_heads < 1 || num_heads % num_kv_heads != 0) {
    return Status::InvalidArgument("num_attention_heads " + std::to_string(num_heads) +
                                   " is not a multiple of num_key_value_heads " +
                                   std::to_string(num_kv_heads));
  }
  const int64_t group = num_heads / num_kv_heads;
  RankShard s;
  s.rank = rank;
  s.tp = tp;
  if (num_kv_heads % tp == 0) {
    s.kv_heads = split(num_kv_heads, tp, rank);
    s.q_heads = {s.kv_heads.begin * group, s.kv_heads.end * group};
  } else if (tp % num_kv_heads == 0) {
    // Each KV head is replicated on tp / kv ranks, which split its query heads between them.
    const int replicas = tp / static_cast<int>(num_kv_heads);
    const int64_t kv = rank / replicas;
    s.kv_heads = {kv, kv + 1};
    const Range part = split(group, replicas, rank % replicas);
    s.q_heads = {kv * group + part.begin, kv * group + part.end};
  } else {
    return Status::InvalidArgument(std::to_string(num_kv_heads) +
                                   " KV heads cannot be split over " + std::to_string(tp) +
                                   " TP ranks (need one to divide the other)");
  }
  s.intermediate = split(intermediate, tp, rank);
  s.vocab = split(vocab, tp, rank);
  return s;
}

}  // namespace kvrt::exec
