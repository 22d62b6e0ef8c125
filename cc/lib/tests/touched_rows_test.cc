#include "cc/lib/touched_rows.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace {

using Rows = std::vector<int64_t>;

TEST(TouchedRows, ReportsRowsMarkedAfterEachConsumersVersion) {
  TouchedRows t(100);
  EXPECT_TRUE(t.Since(0, 100).full);  // a version from before tracking
  const int64_t start = t.version();
  EXPECT_FALSE(t.Since(start, 100).full);
  EXPECT_TRUE(t.Since(start, 100).rows.empty());
  t.BeginUpdate();
  t.Mark(7);
  t.Mark(3);
  t.Mark(7);
  const int64_t after_first = t.version();
  t.BeginUpdate();
  t.Mark(99);
  EXPECT_EQ(t.Since(start, 100).rows, (Rows{3, 7, 99}));
  EXPECT_EQ(t.Since(after_first, 100).rows, (Rows{99}));  // another consumer, its own version
  EXPECT_TRUE(t.Since(t.version(), 100).rows.empty());
  EXPECT_TRUE(t.Since(t.version() + 1, 100).full);  // never given out
}

TEST(TouchedRows, MarkAllIsFullForOlderVersionsOnly) {
  TouchedRows t(10);
  const int64_t v = t.version();
  t.BeginUpdate();
  t.MarkAll();
  EXPECT_TRUE(t.Since(v, 10).full);
  const int64_t w = t.version();
  EXPECT_FALSE(t.Since(w, 10).full);
  t.BeginUpdate();
  t.Mark(4);
  EXPECT_EQ(t.Since(w, 10).rows, (Rows{4}));
}

TEST(TouchedRows, GrowsAndLogsEvictionsWithABound) {
  TouchedRows t(1, /*max_evicted_log=*/4);
  ASSERT_TRUE(t.Reserve(200000));
  EXPECT_GE(t.capacity(), 200000);
  const int64_t v = t.version();
  t.BeginUpdate();
  t.Mark(199999);
  t.LogEviction(11);
  t.LogEviction(12);
  EXPECT_EQ(t.Since(v, t.capacity()).rows, (Rows{199999}));
  EXPECT_EQ(t.Since(v, t.capacity()).evicted, (Rows{11, 12}));
  const int64_t w = t.version();
  t.BeginUpdate();
  t.LogEviction(13);
  EXPECT_EQ(t.Since(w, t.capacity()).evicted, (Rows{13}));
  t.BeginUpdate();
  t.LogEviction(14);
  t.LogEviction(15);  // over the bound: the oldest half (version v + 1) is dropped
  EXPECT_TRUE(t.Since(v, t.capacity()).full);
  EXPECT_FALSE(t.Since(w, t.capacity()).full);
  EXPECT_EQ(t.Since(w, t.capacity()).evicted, (Rows{13, 14, 15}));
}

}  // namespace
}  // namespace tf_embed_ops
