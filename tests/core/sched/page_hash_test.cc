#include "core/sched/page_hash.h"

#include <gtest/gtest.h>

namespace kvrt::sched {
namespace {

TEST(PageHash, EqualPrefixesHashEqually) {
  const uint64_t root = root_hash("stories260k/f32");
  std::vector<int32_t> a = {1, 403, 407, 261, 378, 432, 383, 286, 261};
  std::vector<int32_t> b = {1, 403, 407, 261, 378, 432, 383, 286, 999};
  std::vector<uint64_t> ha = page_hashes(root, a, 4), hb = page_hashes(root, b, 4);
  ASSERT_EQ(ha.size(), 2u);  // the 9th token is a partial page: no hash
  EXPECT_EQ(ha, hb);
  b[7] = 5;
  hb = page_hashes(root, b, 4);
  EXPECT_EQ(ha[0], hb[0]);
  EXPECT_NE(ha[1], hb[1]);
}

TEST(PageHash, ChainedOnTheParent) {
  // The same page of tokens after different prefixes is a different page.
  const uint64_t root = root_hash("m");
  std::vector<int32_t> x = {1, 2, 3, 4, 9, 9, 9, 9}, y = {5, 6, 7, 8, 9, 9, 9, 9};
  EXPECT_NE(page_hashes(root, x, 4)[1], page_hashes(root, y, 4)[1]);
  EXPECT_EQ(page_hashes(root, x, 4)[1],
            page_hash(page_hash(root, {x.data(), 4}), {x.data() + 4, 4}));
}

TEST(PageHash, RootSeparatesModels) {
  std::vector<int32_t> t = {1, 2, 3, 4};
  EXPECT_NE(page_hashes(root_hash("model-a"), t, 4), page_hashes(root_hash("model-b"), t, 4));
  EXPECT_EQ(root_hash("model-a"), root_hash("model-a"));
}

}  // namespace
}  // namespace kvrt::sched
