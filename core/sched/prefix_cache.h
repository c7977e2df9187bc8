// The prefix cache: a radix tree over full KV pages (SGLang's RadixCache with page-sized edges).
// Each node is one page of page_size tokens, keyed under its parent by the page's chained hash,
// so a path from the root is a cached prefix and the same hashes name its pages in a KV tier.
// Requests lock the path they use; unlocked nodes are evictable, least recently used leaves
// first. The cache owns the pages in its nodes; the scheduler owns the free list.
//
// Not thread-safe: the scheduler thread is its only user.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/sched/kv_tier.h"

namespace kvrt::sched {

class PrefixCache {
 public:
  struct Node {
    Node* parent = nullptr;
    std::unordered_map<uint64_t, std::unique_ptr<Node>> children;  // by page hash
    std::vector<int32_t> tokens;                                   // the page's token ids
    uint64_t hash = 0;         // chained page hash (the root's: the model's root hash)
    int32_t page = -1;         // device page id (-1 at the root)
    int32_t depth = 0;         // pages from the root
    int32_t lock_ref = 0;      // requests whose locked path runs through this node
    uint64_t last_access = 0;  // LRU clock
    bool in_leaf_set = false;  // filed in evictable_leaves_ under leaf_key
    uint64_t leaf_key = 0;
  };

  struct Match {
    Node* last = nullptr;        // deepest matched node (the root when nothing matched)
    std::vector<int32_t> pages;  // device pages of the matched full pages, in order
  };

  // `tier` (optional, not owned) hears of inserted, hit and evicted pages.
  PrefixCache(uint32_t page_size, uint64_t root_hash, KvTier* tier = nullptr);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // The longest cached prefix of `tokens` in full pages. Marks the matched nodes as used now.
  // With report_hits, tells the tier (KVRT_TIER_HIT) about the matched pages.
  Match match(std::span<const int32_t> tokens, bool report_hits = false);

  // The chained hashes of the full pages of `tokens` after `from` (a node on its path), at most
  // max_pages of them: what to ask a tier for when the device holds only the prefix up to `from`.
  std::vector<uint64_t> hashes_after(const Node* from, std::span<const int32_t> tokens,
                                     uint64_t max_pages) const;

  // Caches the full pages of tokens[0, pages.size() * page_size) held in `pages`. Where the
  // tree already holds a page of that prefix its page wins: pages[i] is replaced by the tree's
  // and the caller's page is appended to *duplicates (the caller frees it). New nodes are
  // reported to the tier (KVRT_TIER_INSERTED). Returns the deepest node of the prefix.
  // `from` (a node on the prefix's path, whose pages are pages[0, from->depth)) skips hashing
  // and walking what is already cached; nullptr starts at the root.
  Node* insert(std::span<const int32_t> tokens, std::span<int32_t> pages,
               std::vector<int32_t>* duplicates, Node* from = nullptr);

  // Locks / unlocks the path from `node` to the root (a request using that prefix).
  void lock(Node* node);
  void unlock(Node* node);

  // Frees up to `n` unlocked pages, least recently used leaves first, appending their ids to
  // *freed. Reports them to the tier (KVRT_TIER_EVICTING) first; the caller must wait() on the
  // tier before rewriting them. Returns how many were freed.
  uint64_t evict(uint64_t n, std::vector<int32_t>* freed);

  Node* root() { return root_.get(); }
  uint32_t page_size() const { return page_size_; }
  uint64_t cached_pages() const { return cached_pages_; }        // pages in the tree
  uint64_t evictable_pages() const { return evictable_pages_; }  // of which unlocked

  // Every page id the tree holds (for invariant checks).
  void collect_pages(std::vector<int32_t>* out) const;

 private:
  void touch_leaf_set(Node* node);  // keeps evictable_leaves_ in step with node's state
  bool is_evictable_leaf(const Node* node) const {
    return node != root_.get() && node->lock_ref == 0 && node->children.empty();
  }

  uint32_t page_size_;
  KvTier* tier_;
  std::unique_ptr<Node> root_;
  uint64_t clock_ = 0;
  uint64_t cached_pages_ = 0;
  uint64_t evictable_pages_ = 0;
  std::set<std::pair<uint64_t, Node*>> evictable_leaves_;  // (last_access, node)
  std::vector<uint64_t> hash_buffer_;
  std::vector<int32_t> page_buffer_;
};

}  // namespace kvrt::sched
