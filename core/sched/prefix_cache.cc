#include "core/sched/prefix_cache.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "core/sched/page_hash.h"

namespace kvrt::sched {
namespace {

// The tier is best effort (a page it misses is recomputed), but a failing one is reported.
void log_tier_failure(const Status& s, const char* reason) {
  if (!s.ok()) spdlog::warn("KV tier: saving {} pages: {}", reason, s.message());
}

}  // namespace

PrefixCache::PrefixCache(uint32_t page_size, uint64_t root_hash, KvTier* tier)
    : page_size_(page_size), tier_(tier), root_(std::make_unique<Node>()) {
  root_->hash = root_hash;
}

PrefixCache::~PrefixCache() {
  // Iterative teardown: a long chain of nodes would otherwise recurse once per page.
  std::vector<std::unique_ptr<Node>> stack;
  for (auto& [h, child] : root_->children) stack.push_back(std::move(child));
  while (!stack.empty()) {
    std::unique_ptr<Node> n = std::move(stack.back());
    stack.pop_back();
    for (auto& [h, child] : n->children) stack.push_back(std::move(child));
  }
}

PrefixCache::Match PrefixCache::match(std::span<const int32_t> tokens, bool report_hits) {
  Match m;
  m.last = root_.get();
  const uint64_t full = tokens.size() / page_size_;
  ++clock_;
  hash_buffer_.clear();
  for (uint64_t i = 0; i < full; ++i) {
    std::span<const int32_t> page = tokens.subspan(i * page_size_, page_size_);
    const uint64_t h = page_hash(m.last->hash, page);
    auto it = m.last->children.find(h);
    if (it == m.last->children.end() ||
        !std::equal(page.begin(), page.end(), it->second->tokens.begin())) {
      break;
    }
    m.last = it->second.get();
    m.pages.push_back(m.last->page);
    if (report_hits) hash_buffer_.push_back(h);
  }
  for (Node* n = m.last; n != root_.get(); n = n->parent) {
    n->last_access = clock_;
    touch_leaf_set(n);
  }
  if (tier_ != nullptr && !hash_buffer_.empty()) {
    // Best effort: a failed report only means the tier's policy saw one hit fewer.
    log_tier_failure(tier_->save(hash_buffer_, m.pages, KVRT_TIER_HIT), "hit");
  }
  return m;
}

std::vector<uint64_t> PrefixCache::hashes_after(const Node* from, std::span<const int32_t> tokens,
                                                uint64_t max_pages) const {
  std::vector<uint64_t> out;
  const uint64_t full = tokens.size() / page_size_;
  uint64_t h = from->hash;
  for (uint64_t i = static_cast<uint64_t>(from->depth); i < full && out.size() < max_pages; ++i) {
    h = page_hash(h, tokens.subspan(i * page_size_, page_size_));
    out.push_back(h);
  }
  return out;
}

PrefixCache::Node* PrefixCache::insert(std::span<const int32_t> tokens, std::span<int32_t> pages,
                                       std::vector<int32_t>* duplicates, Node* from) {
  Node* node = from != nullptr ? from : root_.get();
  ++clock_;
  for (Node* n = node; n != root_.get(); n = n->parent) {  // the cached part is used now too
    n->last_access = clock_;
    touch_leaf_set(n);
  }
  hash_buffer_.clear();
  page_buffer_.clear();
  for (size_t i = static_cast<size_t>(node->depth); i < pages.size(); ++i) {
    std::span<const int32_t> page = tokens.subspan(i * page_size_, page_size_);
    const uint64_t h = page_hash(node->hash, page);
    auto it = node->children.find(h);
    if (it != node->children.end()) {
      if (!std::equal(page.begin(), page.end(), it->second->tokens.begin())) {
        break;  // a 64-bit hash collision: cache no further down this path
      }
      Node* child = it->second.get();
      if (child->page != pages[i]) {
        duplicates->push_back(pages[i]);
        pages[i] = child->page;
      }
      node = child;
    } else {
      auto child = std::make_unique<Node>();
      child->parent = node;
      child->tokens.assign(page.begin(), page.end());
      child->hash = h;
      child->page = pages[i];
      child->depth = node->depth + 1;
      Node* raw = child.get();
      node->children.emplace(h, std::move(child));
      ++cached_pages_;
      ++evictable_pages_;
      touch_leaf_set(node);  // the parent is no longer a leaf
      hash_buffer_.push_back(h);
      page_buffer_.push_back(pages[i]);
      node = raw;
    }
    node->last_access = clock_;
    touch_leaf_set(node);
  }
  if (tier_ != nullptr && !hash_buffer_.empty()) {
    log_tier_failure(tier_->save(hash_buffer_, page_buffer_, KVRT_TIER_INSERTED), "inserted");
  }
  return node;
}

void PrefixCache::lock(Node* node) {
  for (Node* n = node; n != root_.get(); n = n->parent) {
    if (n->lock_ref++ == 0) {
      --evictable_pages_;
      touch_leaf_set(n);
    }
  }
}

void PrefixCache::unlock(Node* node) {
  for (Node* n = node; n != root_.get(); n = n->parent) {
    if (--n->lock_ref == 0) {
      ++evictable_pages_;
      touch_leaf_set(n);
    }
  }
}

uint64_t PrefixCache::evict(uint64_t n, std::vector<int32_t>* freed) {
  uint64_t done = 0;
  hash_buffer_.clear();
  page_buffer_.clear();
  while (done < n && !evictable_leaves_.empty()) {
    Node* leaf = evictable_leaves_.begin()->second;
    evictable_leaves_.erase(evictable_leaves_.begin());
    leaf->in_leaf_set = false;
    hash_buffer_.push_back(leaf->hash);
    page_buffer_.push_back(leaf->page);
    freed->push_back(leaf->page);
    Node* parent = leaf->parent;
    parent->children.erase(leaf->hash);  // destroys leaf
    --cached_pages_;
    --evictable_pages_;
    ++done;
    touch_leaf_set(parent);  // it may have become an evictable leaf
  }
  if (tier_ != nullptr && !hash_buffer_.empty()) {
    log_tier_failure(tier_->save(hash_buffer_, page_buffer_, KVRT_TIER_EVICTING), "evicting");
  }
  return done;
}

void PrefixCache::collect_pages(std::vector<int32_t>* out) const {
  std::vector<const Node*> stack{root_.get()};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    if (n != root_.get()) out->push_back(n->page);
    for (const auto& [h, child] : n->children) stack.push_back(child.get());
  }
}

void PrefixCache::touch_leaf_set(Node* node) {
  if (node == root_.get()) return;
  const bool want = is_evictable_leaf(node);
  if (node->in_leaf_set && (!want || node->leaf_key != node->last_access)) {
    evictable_leaves_.erase({node->leaf_key, node});
    node->in_leaf_set = false;
  }
  if (want && !node->in_leaf_set) {
    node->leaf_key = node->last_access;
    evictable_leaves_.insert({node->leaf_key, node});
    node->in_leaf_set = true;
  }
}

}  // namespace kvrt::sched
