#include "cc/lib/touched_rows.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "cc/lib/dynamic_table.h"
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

// The dynamic table's hooks: training lookups mark found and inserted rows, evictions log keys (and only when
// tracking is on), an import marks everything, and growth keeps every row markable.
TEST(TouchedRows, DynamicTableHooks) {
  DynamicTableOptions o;
  o.name = "items";
  o.dim = 2;
  o.initial_capacity = 2;
  o.max_rows = 1000;
  o.rows_per_chunk = 2;
  absl::StatusOr<std::unique_ptr<DynamicTable>> made = DynamicTable::Create(o);
  ASSERT_TRUE(made.ok()) << made.status();
  DynamicTable& t = **made;
  std::vector<int64_t> rows(3);
  const std::vector<int64_t> first = {10, 20, 10};
  ASSERT_TRUE(t.FindOrInsert(first.data(), 3, 0, rows.data()).ok());  // before tracking: not recorded
  ASSERT_TRUE(t.EnableTracking());
  TouchedRows* touched = t.tracker();
  const int64_t v0 = touched->version();
  EXPECT_TRUE(touched->Since(v0, touched->capacity()).rows.empty());
  const std::vector<int64_t> second = {20, 30, 40};  // one found, two inserted (the table grows)
  ASSERT_TRUE(t.FindOrInsert(second.data(), 3, 1, rows.data()).ok());
  Rows changed = touched->Since(v0, touched->capacity()).rows;
  Rows keys;
  for (int64_t r : changed) keys.push_back(t.KeyOf(r));
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, (Rows{20, 30, 40}));
  const int64_t v1 = touched->version();
  const std::vector<int64_t> evict = {10, 30};
  EXPECT_EQ(t.EvictKeys(evict.data(), 2), 2);
  TouchedRows::Changes after = touched->Since(v1, touched->capacity());
  EXPECT_TRUE(after.rows.empty());
  EXPECT_EQ(after.evicted, (Rows{10, 30}));
  const int64_t v2 = touched->version();
  ASSERT_TRUE(t.Import(t.Export()).ok());
  EXPECT_TRUE(touched->Since(v2, touched->capacity()).full);
}

}  // namespace
}  // namespace tf_embed_ops
