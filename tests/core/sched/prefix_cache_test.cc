#include "core/sched/prefix_cache.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>

#include "core/sched/page_hash.h"

namespace kvrt::sched {
namespace {

constexpr uint32_t kPage = 4;

std::vector<int32_t> seq(int32_t from, int32_t n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

// Records what the cache reports, per reason.
struct RecordingTier : KvTier {
  std::map<kvrt_tier_reason, std::vector<std::pair<uint64_t, int32_t>>> saved;
  uint64_t lookup(std::span<const uint64_t>) override { return 0; }
  Status save(std::span<const uint64_t> hashes, std::span<const int32_t> pages,
              kvrt_tier_reason reason) override {
    for (size_t i = 0; i < hashes.size(); ++i) saved[reason].push_back({hashes[i], pages[i]});
    return Status::Ok();
  }
  Status load(std::span<const uint64_t>, std::span<const int32_t>, std::vector<uint8_t>*) override {
    return Status::Ok();
  }
  Status wait() override { return Status::Ok(); }
};

TEST(PrefixCache, MatchesFullPagesOnly) {
  PrefixCache cache(kPage, root_hash("m"));
  std::vector<int32_t> tokens = seq(0, 10);  // 2 full pages + 2 tokens
  std::vector<int32_t> pages = {7, 3};
  std::vector<int32_t> dup;
  cache.insert(std::span(tokens).first(8), pages, &dup);
  EXPECT_TRUE(dup.empty());
  EXPECT_EQ(cache.cached_pages(), 2u);

  PrefixCache::Match m = cache.match(tokens);
  EXPECT_EQ(m.pages, (std::vector<int32_t>{7, 3}));
  EXPECT_EQ(m.last->depth, 2);
  // A different second page matches only the first.
  std::vector<int32_t> other = tokens;
  other[5] = 99;
  EXPECT_EQ(cache.match(other).pages, (std::vector<int32_t>{7}));
  // Shorter than a page: nothing.
  EXPECT_TRUE(cache.match(std::span(tokens).first(3)).pages.empty());
}

TEST(PrefixCache, TheTreesPageWinsOverADuplicate) {
  PrefixCache cache(kPage, root_hash("m"));
  std::vector<int32_t> tokens = seq(100, 12);
  std::vector<int32_t> first = {1, 2};
  std::vector<int32_t> dup;
  cache.insert(std::span(tokens).first(8), first, &dup);
  std::vector<int32_t> second = {5, 6, 9};  // computed the same prefix again, plus one page
  PrefixCache::Node* last = cache.insert(tokens, second, &dup);
  EXPECT_EQ(dup, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(second, (std::vector<int32_t>{1, 2, 9}));
  EXPECT_EQ(last->depth, 3);
  EXPECT_EQ(cache.cached_pages(), 3u);
}

TEST(PrefixCache, LockedPathsAreNotEvicted) {
  PrefixCache cache(kPage, root_hash("m"));
  std::vector<int32_t> a = seq(0, 8), b = seq(50, 8);
  std::vector<int32_t> pa = {0, 1}, pb = {2, 3}, dup;
  PrefixCache::Node* na = cache.insert(a, pa, &dup);
  cache.insert(b, pb, &dup);
  cache.lock(na);
  EXPECT_EQ(cache.evictable_pages(), 2u);
  std::vector<int32_t> freed;
  EXPECT_EQ(cache.evict(10, &freed), 2u);
  std::sort(freed.begin(), freed.end());
  EXPECT_EQ(freed, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(cache.match(a).pages, pa);
  cache.unlock(na);
  EXPECT_EQ(cache.evictable_pages(), 2u);
  freed.clear();
  EXPECT_EQ(cache.evict(10, &freed), 2u);
  EXPECT_EQ(cache.cached_pages(), 0u);
}

TEST(PrefixCache, EvictsLeastRecentlyUsedLeavesFirst) {
  PrefixCache cache(kPage, root_hash("m"));
  std::vector<int32_t> a = seq(0, 8), b = seq(50, 8), dup;
  std::vector<int32_t> pa = {0, 1}, pb = {2, 3};
  cache.insert(a, pa, &dup);
  cache.insert(b, pb, &dup);
  cache.match(a);  // a is now the most recent
  std::vector<int32_t> freed;
  cache.evict(1, &freed);
  EXPECT_EQ(freed, (std::vector<int32_t>{3}));  // b's leaf
  cache.evict(1, &freed);
  EXPECT_EQ(freed.back(), 2);  // then b's first page, now a leaf and older than a's
  cache.evict(2, &freed);
  EXPECT_EQ(freed, (std::vector<int32_t>{3, 2, 1, 0}));  // a leaf before its parent
}

TEST(PrefixCache, TellsTheTierWhatItInsertsHitsAndEvicts) {
  RecordingTier tier;
  const uint64_t root = root_hash("m");
  PrefixCache cache(kPage, root, &tier);
  std::vector<int32_t> t = seq(0, 8), pages = {4, 5}, dup;
  cache.insert(t, pages, &dup);
  std::vector<uint64_t> hashes = page_hashes(root, t, kPage);
  ASSERT_EQ(tier.saved[KVRT_TIER_INSERTED].size(), 2u);
  EXPECT_EQ(tier.saved[KVRT_TIER_INSERTED][1], (std::pair<uint64_t, int32_t>{hashes[1], 5}));
  cache.match(t, /*report_hits=*/true);
  EXPECT_EQ(tier.saved[KVRT_TIER_HIT].size(), 2u);
  std::vector<int32_t> freed;
  cache.evict(2, &freed);
  ASSERT_EQ(tier.saved[KVRT_TIER_EVICTING].size(), 2u);
  EXPECT_EQ(tier.saved[KVRT_TIER_EVICTING][0], (std::pair<uint64_t, int32_t>{hashes[1], 5}));
  // The same hashes name the pages a tier is asked for later.
  EXPECT_EQ(cache.hashes_after(cache.root(), t, 10), hashes);
}

}  // namespace
}  // namespace kvrt::sched
